"""Authentication and TLS on a real head's gRPC server (127.0.0.1, free ports, no Ray): every RPC refuses a missing
or wrong credential, join tokens expire and are revoked, clients that do not trust the head's CA cannot connect, node
calls need the node's client certificate, failures are limited per peer and logged without the secret; and on the
real cluster, no token shows in `ps`, the logs or the store."""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from google.protobuf import message_factory
from typer.testing import CliRunner, Result

import farm.proto.v1
from farm.cli import head as head_cli
from farm.client import Client, HeadInfo
from farm.core.errors import AuthError, HeadUnavailableError
from farm.head.auth import hash_token
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.local import ray_temp_dir, read_json
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm.tls import HeadTLS, ca_hash, fetch_ca, join_command
from farm_agent.daemon.client import credentials
from tests.conftest import ROOT, Cluster
from tests.integration.inprocess_head import HW, Head, running_head

# Every service of every generated module: a new RPC, or a new service, is called by these tests without being named.
SERVICES = [service for module in pkgutil.iter_modules(farm.proto.v1.__path__) if module.name.endswith("_pb2")
            for service in importlib.import_module(f"farm.proto.v1.{module.name}").DESCRIPTOR.services_by_name.values()]
READS = {"ListNodes", "Get", "List", "Watch", "Logs", "FollowLogs"}


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path) as running:  # loopback peers are not limited by default
        yield running


def call_every_rpc(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...], credential: str
                   ) -> dict[str, grpc.StatusCode]:
    """Call each method of each service once, with an empty request but for `credential` in any token field."""
    codes = {}
    for service in SERVICES:
        for method in service.methods:
            request_class = message_factory.GetMessageClass(method.input_type)
            fields = {f.name for f in method.input_type.fields}
            request = request_class(**{name: credential for name in ("join_token", "node_token") if name in fields},
                                    **({"node_id": "n-00000000"} if "node_id" in fields else {}))
            path = f"/{service.full_name}/{method.name}"
            kind = ("stream" if method.client_streaming else "unary") + "_" + (
                "stream" if method.server_streaming else "unary")
            call: Callable[..., Any] = getattr(channel, kind)(
                path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=bytes)
            argument = iter([request]) if method.client_streaming else request
            try:
                result = call(argument, metadata=metadata, timeout=5)
                if method.server_streaming:
                    list(result)
                codes[method.name] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                codes[method.name] = exc.code()  # type: ignore[attr-defined]
    return codes


@pytest.mark.parametrize("credential", ["", "forged"])
def test_every_rpc_refuses_a_missing_or_wrong_credential(head: Head, credential: str) -> None:
    metadata = (("authorization", f"Bearer {credential}"),) if credential else ()
    with head.channel() as channel:
        codes = call_every_rpc(channel, metadata, credential)
    assert len(codes) >= 10  # the descriptors, not a list kept by hand: a new RPC is called here too
    assert {name: code for name, code in codes.items() if code is not grpc.StatusCode.UNAUTHENTICATED} == {}


def test_the_join_token_is_not_an_api_token_nor_a_node_token(head: Head) -> None:
    with head.channel() as channel:
        codes = call_every_rpc(channel, (("authorization", f"Bearer {head.tokens.join}"),), head.tokens.api)
    assert {name for name, code in codes.items() if code is not grpc.StatusCode.UNAUTHENTICATED} == set()


def test_open_read_lets_listing_through_but_not_submitting(tmp_path: Path) -> None:
    with running_head(tmp_path, open_read=True) as head, head.channel() as channel:
        codes = call_every_rpc(channel, (), "")
    refused = {name for name, code in codes.items() if code is grpc.StatusCode.UNAUTHENTICATED}
    assert READS.isdisjoint(refused)
    assert {"Submit", "Cancel", "Register", "Heartbeat", "Deregister"} <= refused


def test_created_tokens_join_until_revoked_and_expired_ones_never(head: Head) -> None:
    def farm(command: str, *args: str) -> Result:  # `farm head token ...`, in this process (a CLI start costs seconds)
        return CliRunner().invoke(head_cli.app, ["token", command, "--state-dir", str(head.settings.state_dir), *args])

    created = farm("create", "--ttl", "1h", "--json")
    assert created.exit_code == 0, created.output
    token = read_json_line(created.stdout)
    assert f"--ca-hash {ca_hash(head.ca_pem)} " in token["join_command"] + " "
    reply, _ = head.register(token["token"])
    assert reply.node_id.startswith("n-")

    listed = farm("list", "--json")
    assert token["token"] not in listed.stdout and hash_token(token["token"]) not in listed.stdout
    assert {r["id"] for r in read_json_list(listed.stdout)} == {"default", token["id"]}

    assert farm("revoke", token["id"]).exit_code == 0
    with pytest.raises(grpc.RpcError) as revoked:
        head.register(token["token"])
    assert revoked.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert f"join token {token['id']} was revoked" in str(revoked.value.details())

    store = Store(head.settings.state_dir / "state.db")
    store.add_join_token("jt-expired", hash_token("expired-token"), expires_at=time.time() - 1)
    store.close()
    with pytest.raises(grpc.RpcError) as expired:
        head.register("expired-token")
    assert expired.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "join token jt-expired has expired" in str(expired.value.details())

    head.register(head.tokens.join)  # the default token joins until it, too, is revoked
    assert farm("revoke", "default").exit_code == 0
    with pytest.raises(grpc.RpcError):
        head.register(head.tokens.join)
    bad = subprocess.run([sys.executable, "-m", "farm.cli.main", "head", "token", "create", "--ttl", "soon",
                          "--state-dir", str(head.settings.state_dir)], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)  # the real command line: one line, exit 2
    assert (bad.returncode, bad.stderr.strip().count("\n")) == (2, 0) and "--ttl 'soon'" in bad.stderr


def read_json_line(text: str) -> dict[str, Any]:
    import json

    return dict(json.loads(text.strip().splitlines()[-1]))


def read_json_list(text: str) -> list[dict[str, Any]]:
    import json

    return list(json.loads(text))


def test_a_client_that_does_not_trust_the_head_s_ca_cannot_connect(head: Head, tmp_path: Path) -> None:
    other_ca = HeadTLS.load_or_create(tmp_path / "other", ["127.0.0.1"]).ca_pem
    with head.client(ca_pem=other_ca) as client, pytest.raises(HeadUnavailableError):
        client.nodes()
    info = HeadInfo(address=head.settings.address, api_token=head.tokens.api)  # the system's roots
    with Client(info, timeout=5) as client, pytest.raises(HeadUnavailableError, match="FARM_CA"):
        client.nodes()
    with grpc.insecure_channel(head.settings.address) as plain, pytest.raises(grpc.RpcError) as refused:
        plain.unary_unary("/farm.v1.FleetService/ListNodes")(b"", timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    with head.client() as client:  # and one that trusts it can
        assert client.nodes() == []


def test_node_calls_need_the_node_s_own_client_certificate(head: Head) -> None:
    reply, key_pem = head.register(head.tokens.join, "box")
    other, other_key = head.register(head.tokens.join, "other")
    beat = agent_pb2.HeartbeatRequest(node_id=reply.node_id, node_token=reply.node_token)

    def heartbeat(channel: grpc.Channel) -> list[str]:
        return [r.state for r in agent_pb2_grpc.AgentServiceStub(channel).Heartbeat(
            iter([beat]), metadata=credentials(reply.node_token, reply.node_id), timeout=5)]

    with head.channel() as no_cert, pytest.raises(grpc.RpcError) as refused:  # the node token alone
        heartbeat(no_cert)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "client certificate" in str(refused.value.details())
    with head.channel(port=reply.mtls_port) as handshake, pytest.raises(grpc.RpcError) as failed:
        heartbeat(handshake)  # the mTLS port: no certificate, no handshake
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
    with head.channel(other_key, other.client_cert_pem, reply.mtls_port) as someone_else, \
            pytest.raises(grpc.RpcError) as impostor:
        heartbeat(someone_else)  # another node's certificate with this node's token
    assert impostor.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with head.channel(key_pem, reply.client_cert_pem, reply.mtls_port) as own:
        assert heartbeat(own) == ["joining"]


def test_a_lender_with_a_join_token_cannot_take_over_another_node(head: Head) -> None:
    """Node ids are public (the dashboard): Register with one must not hand the caller that node's token and
    certificate. Only the node itself, over mutual TLS with its certificate, or after an operator's forget-node."""
    alice, alice_key = head.register(head.tokens.join, "alice")
    mallory, mallory_key = head.register(head.tokens.join, "mallory")
    with pytest.raises(grpc.RpcError) as plain:  # the join token and alice's id
        head.register(head.tokens.join, "alice", node_id=alice.node_id)
    assert plain.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "forget-node" in str(plain.value.details())
    with pytest.raises(grpc.RpcError) as other_cert:  # over mutual TLS, with another node's certificate
        head.register(head.tokens.join, "alice", node_id=alice.node_id,
                      identity=(mallory_key, mallory.client_cert_pem))
    assert other_cert.value.code() is grpc.StatusCode.UNAUTHENTICATED

    beat = agent_pb2.HeartbeatRequest(node_id=alice.node_id, node_token=alice.node_token)
    with head.channel(alice_key, alice.client_cert_pem, alice.mtls_port) as own:  # alice's token still holds
        assert [r.state for r in agent_pb2_grpc.AgentServiceStub(own).Heartbeat(
            iter([beat]), metadata=credentials(alice.node_token, alice.node_id), timeout=5)]
    again, _ = head.register(head.tokens.join, "alice", node_id=alice.node_id,
                             identity=(alice_key, alice.client_cert_pem))
    assert again.node_id == alice.node_id  # alice herself, with her certificate

    forgot = CliRunner().invoke(head_cli.app, ["forget-node", "alice", "--state-dir", str(head.settings.state_dir)])
    assert forgot.exit_code == 0, forgot.output
    lost, _ = head.register(head.tokens.join, "alice", node_id=alice.node_id)  # the operator said so
    assert lost.node_id == alice.node_id


def test_a_node_joins_again_on_its_own_credentials_after_its_join_token_is_revoked(head: Head) -> None:
    """An agent started again (after a stop, a reboot) needs no join token: its node token and certificate, which
    the head gave it, are its proof; the join token it joined with may have been revoked since."""
    def farm(*args: str) -> Result:
        return CliRunner().invoke(head_cli.app, [*args, "--state-dir", str(head.settings.state_dir)])

    created = read_json_line(farm("token", "create", "--json").stdout)
    first, key = head.register(created["token"], "alice")
    assert farm("token", "revoke", created["id"]).exit_code == 0
    with pytest.raises(grpc.RpcError) as revoked:
        head.register(created["token"], "bob")
    assert revoked.value.code() is grpc.StatusCode.UNAUTHENTICATED

    again, again_key = head.register("", "alice", node_id=first.node_id, node_token=first.node_token,
                                     identity=(key, first.client_cert_pem))
    assert again.node_id == first.node_id and again.client_cert_pem
    # Its token alone is not proof of being the node (a TLS head wants the certificate too) ...
    with pytest.raises(grpc.RpcError) as no_cert:
        head.register("", "alice", node_id=first.node_id, node_token=again.node_token)
    assert no_cert.value.code() is grpc.StatusCode.UNAUTHENTICATED
    # ... nor its certificate with a stale token, nor a node that does not exist, nor one an operator forgot.
    for node_id, token in ((first.node_id, first.node_token), ("n-00000000", again.node_token)):
        with pytest.raises(grpc.RpcError) as refused:
            head.register("", "alice", node_id=node_id, node_token=token,
                          identity=(again_key, again.client_cert_pem))
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert farm("forget-node", "alice").exit_code == 0
    with pytest.raises(grpc.RpcError) as forgotten:
        head.register("", "alice", node_id=first.node_id, node_token=again.node_token,
                      identity=(again_key, again.client_cert_pem))
    assert forgotten.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_an_insecure_head_takes_a_known_node_id_only_with_its_node_token(tmp_path: Path) -> None:
    with running_head(tmp_path, insecure=True) as head, grpc.insecure_channel(head.settings.address) as channel:
        agents = agent_pb2_grpc.AgentServiceStub(channel)

        def register(node_id: str = "", node_token: str = "") -> agent_pb2.RegisterReply:
            return agents.Register(agent_pb2.RegisterRequest(
                join_token=head.tokens.join, name="box", hardware=convert.hardware_to_pb(HW), node_id=node_id,
                node_token=node_token), metadata=credentials(head.tokens.join), timeout=5)

        first = register()
        with pytest.raises(grpc.RpcError) as refused:
            register(first.node_id)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert register(first.node_id, first.node_token).node_id == first.node_id


def test_the_ray_token_rotates_at_the_next_start_and_with_a_revocation(tmp_path: Path) -> None:
    """Every trusted machine that joined holds the Ray token (Ray's one trust domain): it must not be valid for ever.
    (A lent node gets none: test_execution_path.)"""
    def farm(*args: str) -> Result:
        return CliRunner().invoke(head_cli.app, [*args, "--state-dir", str(tmp_path)])

    def ray_token(head: Any) -> str:  # a trusted node's Register (the API token proves it)
        return str(head.register(head.tokens.join, admin_token=head.tokens.api)[0].ray_token)

    with running_head(tmp_path) as head:
        first = ray_token(head)
        assert first and farm("token", "rotate-ray").exit_code == 0
        assert ray_token(head) == first  # the running cluster keeps its token
    with running_head(tmp_path) as head:
        second = ray_token(head)
        assert second != first
        created = read_json_line(farm("token", "create", "--json").stdout)
        revoked = farm("token", "revoke", created["id"])
        assert revoked.exit_code == 0 and "new Ray token" in revoked.stdout
    with running_head(tmp_path) as head:
        assert ray_token(head) not in (first, second)


def test_the_join_line_keeps_the_token_off_the_command_line(head: Head, tmp_path: Path) -> None:
    """/proc/PID/cmdline is world-readable: a join token there is any local user's, and with it the Ray token."""
    join = join_command(head.settings.address, "s3cret-join", ca_hash(head.ca_pem))
    assignment, *argv = shlex.split(join)
    assert assignment == "FARM_JOIN_TOKEN=s3cret-join" and "s3cret-join" not in " ".join(argv)

    def agent_start(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", "no-port", *args,
                               "--state-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                              env={**os.environ, **(env or {})})

    from_env = agent_start(env={"FARM_JOIN_TOKEN": "s3cret-join"})  # taken: the next check speaks
    assert from_env.returncode == 2 and "expected HOST:PORT" in from_env.stderr, from_env.stderr
    on_line = agent_start("--token", "s3cret-join", "--head", head.settings.address, "--ca-hash", ca_hash(head.ca_pem),
                          "--name", "n")  # its checks pass, then the head refuses the token
    assert on_line.returncode == 2 and "refused" in on_line.stderr, on_line.stderr
    assert "--token shows in `ps`" in on_line.stderr
    from_stdin = subprocess.run([sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", "no-port",
                                 "--token-file", "-"], input="s3cret-join\n", capture_output=True, text=True,
                                cwd=ROOT, timeout=60)
    assert from_stdin.returncode == 2 and "expected HOST:PORT" in from_stdin.stderr, from_stdin.stderr


def test_failures_are_limited_per_peer_and_logged_without_the_secret(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with running_head(tmp_path, auth_failures_allowed=3, auth_block_s=600, limit_loopback=True) as head:
        for attempt in range(3):
            with head.client(token=f"guess-{attempt}-secret") as client, \
                    pytest.raises(AuthError, match="invalid or missing API token"):
                client.nodes()
        with head.client() as client, pytest.raises(AuthError, match="too many failed authentications"):
            client.nodes()  # the right token, refused unchecked for a while
        with pytest.raises(grpc.RpcError) as joining:
            head.register(head.tokens.join)  # the whole address is refused, whatever it presents
        assert joining.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "guess-0-secret" not in caplog.text and head.tokens.api not in caplog.text
    assert head.tokens.join not in caplog.text
    assert f"credential hash {hash_token('guess-0-secret')[:8]}" in caplog.text


def test_an_insecure_head_speaks_plaintext_and_asks_no_certificate(tmp_path: Path) -> None:
    with running_head(tmp_path, insecure=True) as head, grpc.insecure_channel(head.settings.address) as channel:
        agents = agent_pb2_grpc.AgentServiceStub(channel)
        reply = agents.Register(agent_pb2.RegisterRequest(join_token=head.tokens.join, name="box",
                                                          hardware=convert.hardware_to_pb(HW)),
                                metadata=credentials(head.tokens.join), timeout=5)
        assert (reply.mtls_port, reply.client_cert_pem) == (0, b"")
        beat = agent_pb2.HeartbeatRequest(node_id=reply.node_id, node_token=reply.node_token)
        assert [r.state for r in agents.Heartbeat(iter([beat]), metadata=credentials(reply.node_token, reply.node_id),
                                                  timeout=5)] == ["joining"]
        codes = call_every_rpc(channel, (), "forged")  # the tokens are still checked
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}
    assert not (tmp_path / "tls").exists()


def test_a_wrong_ca_hash_refuses_to_join(head: Head, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", head.settings.address, "--token",
         head.tokens.join, "--ca-hash", "sha256:" + "0" * 64, "--name", "n", "--state-dir", str(tmp_path / "a")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "did not present the CA" in result.stderr
    assert not (tmp_path / "a" / "agents" / "n" / "ca.pem").exists()
    assert fetch_ca(head.settings.address, ca_hash(head.ca_pem)) == head.ca_pem  # the right hash pins the CA


def test_no_token_in_ps_logs_or_the_store_and_secrets_are_private(cluster: Cluster) -> None:
    info = read_json(cluster.state_dir / "head.json") or {}
    secrets = [info["join_token"], info["api_token"]]
    pids = [int(info["pid"]), *cluster.agent_pids().values()]
    for pid in pids:
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for proc in family:
            try:
                line = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            assert not any(s in line for s in secrets), f"a token on the command line of {proc.pid}"
    logs = [*cluster.state_dir.glob("*.log"), *cluster.state_dir.glob("agents/*/*.log")]
    assert logs
    for log in logs:
        text = log.read_text(errors="replace")
        assert not any(s in text for s in secrets), f"a token in {log}"
    db = cluster.state_dir / "state.db"
    stored = b"".join(p.read_bytes() for p in (db, db.with_name("state.db-wal")) if p.exists())
    assert not any(s.encode() in stored for s in secrets)
    private = [cluster.state_dir / "head.json", cluster.state_dir / "secrets.json",
               cluster.state_dir / "tls" / "ca.key", cluster.state_dir / "tls" / "head.key"]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # Each Ray node's folder is private: a local user swapped a job's code package in Ray's 0777 working_dir_files.
    nodes = [read_json(p) or {} for p in cluster.state_dir.glob("agents/*/node.json")]
    folders = [ray_temp_dir(str(n["node_id"])) for n in nodes]
    folders.append(HeadSettings(state_dir=cluster.state_dir).ray_temp_dir)
    assert len(folders) == 3
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
