"""Protocol requests from hypothesis against one real head (`farm head start`, once for the module): every RPC of
every service in farm.proto.v1, with messages built from the fields' types (huge and negative numbers, NaN, unicode,
empty and random bytes), with the right credentials or not. The head answers each with a status it chose
(INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, ...), never UNKNOWN or INTERNAL (an exception no servicer handled),
and it is alive and answering afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from farm.client import Client, find_head
from farm.local import processes_in_sessions, read_json, recorded_alive, sessions_of, terminate, wait_for
from farm.proto.v1 import agent_pb2, data_pb2, fleet_pb2, job_pb2, result_pb2
from tests.conftest import farm
from tests.ports import head_ports

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# What the head may answer: its own refusals, and what a client sees of a call that took too long (a Watch of a job
# that never ends). UNKNOWN and INTERNAL are what an unhandled exception in a servicer turns into.
CHOSEN = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
          grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED,
          grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DEADLINE_EXCEEDED}
METHODS = [m for module in (agent_pb2, fleet_pb2, job_pb2, data_pb2, result_pb2) for service in module.DESCRIPTOR.services_by_name.values()
           for m in service.methods]

INTS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def scalar(field: FieldDescriptor, known: dict[str, str]) -> st.SearchStrategy[Any]:
    if field.type in INTS:
        low, high = INTS[field.type]
        return st.sampled_from([v for v in (0, low, high, -1, 1) if low <= v <= high]) | st.integers(low, high)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values]) | st.integers(-5, 1000)
    # Strings: random text, and now and then the right value of this name (a real token, node id, job id), so that
    # calls get past authentication and reach the code behind it.
    right = [known[field.name]] if field.name in known else []
    return st.sampled_from(["", " ", "\x00", "../../etc/passwd", "n-0", "j-0", *right]) | st.text(max_size=40)


def messages(descriptor: Descriptor, known: dict[str, str], depth: int = 0) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(descriptor)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            if value.message_type is not None:
                continue
            fields[field.name] = st.dictionaries(scalar(key, known), scalar(value, known), max_size=3)
        elif field.message_type is not None:
            if depth >= 3:
                continue
            single = messages(field.message_type, known, depth + 1)
            fields[field.name] = st.lists(single, max_size=3) if _repeated(field) else single
        else:
            single = scalar(field, known)
            fields[field.name] = st.lists(single, max_size=3) if _repeated(field) else single
    return st.fixed_dictionaries({}, optional=fields).map(lambda values: cls(**values))


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


class Head:
    def __init__(self, state: Path) -> None:
        self.state = state
        info = read_json(state / "head.json") or {}
        self.info = info
        self.client = Client(find_head(state_dir=state), timeout=5)
        self.known = {"join_token": str(info["join_token"])}

    def call(self, method: MethodDescriptor, request: Any, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
        path = f"/{method.containing_service.full_name}/{method.name}"
        reply_class = message_factory.GetMessageClass(method.output_type)
        kinds = {(False, False): self.client.channel.unary_unary, (False, True): self.client.channel.unary_stream,
                 (True, True): self.client.channel.stream_stream, (True, False): self.client.channel.stream_unary}
        stub = kinds[(method.client_streaming, method.server_streaming)](
            path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=reply_class.FromString)
        try:
            if method.client_streaming:
                reply = stub(iter([request] * 2), metadata=metadata, timeout=3)
            else:
                reply = stub(request, metadata=metadata, timeout=3)
            if method.server_streaming:
                for _ in reply:
                    pass
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return,attr-defined]
        return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    state = tmp_path_factory.mktemp("fuzz-head")
    started = farm("head", "start", "--host", "127.0.0.1", *head_ports(), "--state-dir", str(state), "--detach",
                   timeout=180)
    assert started.returncode == 0, started.stderr
    running = Head(state)
    sessions = sessions_of([int(running.info["pid"])]) - {os.getsid(0)}
    yield running
    running.client.close()
    farm("head", "stop", "--state-dir", str(state))
    wait_for(lambda: not processes_in_sessions(sessions), 20, 0.5)
    terminate(*processes_in_sessions(sessions), grace=5)


@pytest.mark.parametrize("method", METHODS, ids=[f"{m.containing_service.name}.{m.name}" for m in METHODS])
def test_any_request_gets_a_status_the_head_chose(head: Head, method: MethodDescriptor) -> None:
    api = (("authorization", f"Bearer {head.client.head.api_token}"),)
    join = (("authorization", f"Bearer {head.known['join_token']}"),)  # past the gate to Register's own checks

    @FUZZ
    @given(request=messages(method.input_type, head.known),
           metadata=st.sampled_from([api, join, (), (("authorization", "Bearer forged"),)]))
    def any_request(request: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        code = head.call(method, request, metadata)
        assert code in CHOSEN, f"{method.full_name} answered {code.name} to {request!r}"

    any_request()
    assert recorded_alive(head.info)
    head.client.nodes()  # still answering
