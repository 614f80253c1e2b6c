"""Bounds on what a node sends the head: its strings end up in the store, the dashboard, `farm nodes` and the log, so
each is short and printable (no newline to forge a log line with, no megabytes to swell every listing), and a
message as a whole is small. Checked before anything is stored."""

from __future__ import annotations

from google.protobuf.message import Message

from farm.core.errors import UserError

MAX_NAME = 64  # a node's name
MAX_TEXT = 256  # any other string a node sends (a CPU model, a GPU's name, why the owner is busy)
MAX_ITEMS = 64  # entries of any list (GPUs, backends, power readings)
MAX_REGISTER_BYTES = 64 * 1024  # a whole Register (its CSR included)
MAX_BEAT_BYTES = 8 * 1024  # a whole heartbeat


def check_register(request: Message) -> None:
    name = getattr(request, "name", "")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise UserError(f"a node's name must be 1 to {MAX_NAME} printable characters (got {name[:MAX_NAME]!r}"
                        f"{'...' if len(name) > MAX_NAME else ''})")
    _check(request, MAX_REGISTER_BYTES, "Register")


def check_beat(beat: Message) -> None:
    """Per beat, thousands a second: the size (upb's, in C) and the one free-text field, not a walk of them all."""
    if beat.ByteSize() > MAX_BEAT_BYTES:
        raise UserError(f"a heartbeat is at most {MAX_BEAT_BYTES // 1024} KiB")
    busy = getattr(beat, "busy", "")
    if busy and (len(busy) > MAX_TEXT or not busy.isprintable()):
        raise UserError(f"a heartbeat's busy must be at most {MAX_TEXT} printable characters")
    farm = getattr(beat, "farm_cpu_percent", 0.0)
    if not 0.0 <= farm <= 100.0:  # NaN fails this too: the dashboard's JSON would not parse
        raise UserError("a heartbeat's farm_cpu_percent must be a percentage (0 to 100)")
    for memory in getattr(beat, "gpu_memory", ()):
        if len(memory.device) > MAX_NAME or not memory.device.isprintable() or memory.used_bytes > memory.total_bytes:
            raise UserError(f"a heartbeat's gpu_memory names a device of at most {MAX_NAME} printable characters, "
                            "with used_bytes at most total_bytes")


def _check(message: Message, max_bytes: int, what: str) -> None:
    if message.ByteSize() > max_bytes:
        raise UserError(f"a {what} is at most {max_bytes // 1024} KiB")
    _strings(message, what)


def _strings(message: Message, what: str) -> None:
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        if len(values) > MAX_ITEMS:
            raise UserError(f"a {what}'s {field.name} has at most {MAX_ITEMS} entries")
        for item in values:
            if isinstance(item, Message):
                _strings(item, what)
            elif isinstance(item, str) and (len(item) > MAX_TEXT or not item.isprintable()):
                raise UserError(f"a {what}'s {field.name} must be at most {MAX_TEXT} printable characters")
