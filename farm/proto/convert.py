"""Conversions between the domain models (farm.core) and their wire messages. Pure."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from farm.core.energy import DevicePower, Energy
from farm.core.errors import FarmError
from farm.core.models import BackendOffer, Gpu, Hardware, Node
from farm.core.tasks import ShardFigures
from farm.core.tuning import MAX_CANDIDATES, CandidateFigures, Param, TuningOutcome, check_outcome
from farm.proto.v1 import common_pb2, fleet_pb2, result_pb2

MAX_METRICS = 64  # a kind's own figures in one shard's result: a handful (evaluate sends one)
MAX_METRIC_NAME = 64


def hardware_to_pb(hw: Hardware) -> common_pb2.Hardware:
    return common_pb2.Hardware(
        hostname=hw.hostname, os=hw.os, arch=hw.arch, cpu_model=hw.cpu_model, cpu_cores=hw.cpu_cores,
        memory_bytes=hw.memory_bytes, apple_chip=hw.apple_chip,
        gpus=[common_pb2.Gpu(**g.model_dump()) for g in hw.gpus],
    )


def hardware_from_pb(msg: common_pb2.Hardware) -> Hardware:
    return Hardware(
        hostname=msg.hostname, os=msg.os, arch=msg.arch, cpu_model=msg.cpu_model, cpu_cores=max(msg.cpu_cores, 1),
        memory_bytes=msg.memory_bytes, apple_chip=msg.apple_chip,
        gpus=tuple(Gpu(index=g.index, name=g.name, uuid=g.uuid, memory_bytes=g.memory_bytes, driver=g.driver)
                   for g in msg.gpus),
    )


def offer_to_pb(offer: BackendOffer) -> common_pb2.Backend:
    return common_pb2.Backend(**offer.model_dump(mode="json", exclude_none=True))


def offer_from_pb(msg: common_pb2.Backend) -> BackendOffer:
    """An idle draw counts only with its meter named (proto3 has no unset double)."""
    fields = to_dict(msg)
    if not msg.idle_source:
        fields.pop("idle_w", None)
    return BackendOffer.model_validate(fields)


def node_to_pb(node: Node) -> fleet_pb2.Node:
    return fleet_pb2.Node(
        id=node.id, name=node.name, state=node.state.value, hardware=hardware_to_pb(node.hardware),
        backends=[offer_to_pb(b) for b in node.backends], ray_node_id=node.ray_node_id,
        last_heartbeat=node.last_heartbeat, cpu_percent=node.cpu_percent, memory_percent=node.memory_percent,
        address=node.address, registered_at=node.registered_at, power=[power_to_pb(p) for p in node.power],
        busy=node.busy, drain=node.drain, farm_cpu_percent=node.farm_cpu_percent,
        gpu_memory=[common_pb2.GpuMemory(**m.model_dump()) for m in node.gpu_memory], trusted=node.trusted,
    )


def power_to_pb(power: DevicePower) -> common_pb2.DevicePower:
    return common_pb2.DevicePower(**power.model_dump(mode="json"))


def power_from_pb(msg: common_pb2.DevicePower) -> DevicePower:
    return DevicePower.model_validate(to_dict(msg))


def to_dict(msg: Message) -> dict[str, Any]:
    """A message as JSON-ready data with the proto's field names and every field present.

    Unlike protobuf's JSON mapping, 64-bit integers stay numbers: these dicts are for people and scripts reading
    `--json`, not for round-tripping through protobuf.
    """
    data = MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _int64_as_numbers(msg, data)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64}


def _int64_as_numbers(msg: Message, data: dict[str, Any]) -> dict[str, Any]:
    for field in msg.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(msg, field.name)
        if field.type in _INT64:
            data[field.name] = [int(v) for v in value] if field.is_repeated else int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                data[field.name] = [_int64_as_numbers(m, d) for m, d in zip(value, data[field.name], strict=True)]
            else:
                data[field.name] = _int64_as_numbers(value, data[field.name])
    return data


def energy_to_pb(energy: Energy) -> result_pb2.Energy:
    return result_pb2.Energy(**energy.model_dump(mode="json"))


def figures_to_pb(figures: ShardFigures) -> result_pb2.ShardFigures:
    return result_pb2.ShardFigures(
        items=figures.items, seconds=figures.seconds, correct=figures.correct,
        energy=energy_to_pb(figures.energy) if figures.energy is not None else None,
        peak_memory_bytes=figures.peak_memory_bytes, log=figures.log, metrics=dict(figures.metrics),
        tuning=tuning_to_pb(figures.tuning) if figures.tuning is not None else None,
    )


def _param_to_pb(value: Param) -> result_pb2.ParamValue:
    if isinstance(value, bool):
        return result_pb2.ParamValue(flag=value)
    if isinstance(value, int):
        return result_pb2.ParamValue(integer=value)
    if isinstance(value, float):
        return result_pb2.ParamValue(number=value)
    return result_pb2.ParamValue(text=value)


def tuning_to_pb(outcome: TuningOutcome) -> result_pb2.TuningOutcome:
    return result_pb2.TuningOutcome(
        winner=outcome.winner, params={k: _param_to_pb(v) for k, v in outcome.params}, reason=outcome.reason,
        tuning_s=outcome.tuning_s, tuning_j=outcome.tuning_j, device_name=outcome.device_name, driver=outcome.driver,
        torch_version=outcome.torch_version, input_shapes=list(outcome.input_shapes),
        candidates=[result_pb2.CandidateFigures(name=c.name, ms=c.ms, joules=c.joules, note=c.note, seconds=c.seconds)
                    for c in outcome.candidates])


def tuning_from_pb(msg: result_pb2.TuningOutcome) -> TuningOutcome:
    """A node's tuning outcome, checked (farm.core.tuning.check_outcome): BadFigures otherwise."""
    if len(msg.candidates) > MAX_CANDIDATES:  # before a tuple of them is built
        raise BadFigures(f"its tuning outcome: more than {MAX_CANDIDATES} candidates")
    params: list[tuple[str, Param]] = []
    for name in sorted(msg.params):
        value = msg.params[name]
        which = value.WhichOneof("value")
        if which is None:
            raise BadFigures(f"its tuning's parameter {name[:64]!r} has no value")
        params.append((name, getattr(value, which)))
    try:
        return check_outcome(TuningOutcome(
            winner=msg.winner, params=tuple(params), reason=msg.reason, tuning_s=msg.tuning_s,
            tuning_j=msg.tuning_j if msg.HasField("tuning_j") else None, device_name=msg.device_name,
            driver=msg.driver, torch_version=msg.torch_version, input_shapes=tuple(msg.input_shapes),
            candidates=tuple(CandidateFigures(name=c.name, ms=c.ms if c.HasField("ms") else None,
                                              joules=c.joules if c.HasField("joules") else None, note=c.note,
                                              seconds=c.seconds if c.HasField("seconds") else None)
                             for c in msg.candidates)))
    except ValueError as exc:
        raise BadFigures(f"its tuning outcome: {exc}") from None


class BadFigures(FarmError):
    """Figures from a node that no shard could have measured."""


def figures_from_pb(msg: result_pb2.ShardFigures) -> ShardFigures:
    """A node's figures, checked: counts at least 0, times and figures finite (a node sends what its job's code
    made it send)."""
    numbers = [msg.seconds, *msg.metrics.values()]
    if msg.items < 0 or msg.peak_memory_bytes < 0 or not all(math.isfinite(n) for n in numbers) or msg.seconds < 0:
        raise BadFigures("its figures are out of range (a negative count or time, or a figure that is not finite)")
    correct = msg.correct if msg.HasField("correct") else None
    if correct is not None and not 0 <= correct <= msg.items:
        raise BadFigures(f"its figures say {correct} correct of {msg.items} items")
    if len(msg.metrics) > MAX_METRICS or any(len(name) > MAX_METRIC_NAME for name in msg.metrics):
        raise BadFigures(f"its figures hold more than {MAX_METRICS} metrics or a name over {MAX_METRIC_NAME} "
                         "characters")
    energy = None
    if msg.HasField("energy"):
        try:
            energy = Energy.model_validate(to_dict(msg.energy))
        except ValueError as exc:
            raise BadFigures(f"its energy is not one: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") \
                from None
    return ShardFigures(items=msg.items, seconds=msg.seconds, correct=correct, energy=energy,
                        peak_memory_bytes=msg.peak_memory_bytes, log=msg.log, metrics=dict(msg.metrics),
                        tuning=tuning_from_pb(msg.tuning) if msg.HasField("tuning") else None)
