"""Reading kio entities from untrusted bytes.

kio's native ``entity_reader`` cannot be given a client's bytes:

* it raises ``KeyError`` on a tag its schema does not list, but KIP-482 says a
  receiver must skip unknown tags (a newer client may send them);
* it allocates an array's storage from the count on the wire before reading the items,
  so a 40-byte request announcing 2^32 items aborts the whole process (Rust
  ``handle_alloc_error``; no Python exception to catch).

So this module walks an entity field by field in Python, using kio's schema classes
and kio's native readers for scalar fields only. Arrays (of structs or primitives)
are read here, and their count must not exceed the bytes left (every item takes at
least one byte). Each TAGGED_FIELDS section reads the tags the schema knows and skips
the rest.

Nullable structs (KIP-893) are an int8 marker, -1 = null, 1 = present, then the struct.

int64 durations are read here too: kio's reader overflows (an error, so a dropped connection)
beyond 2^63 microseconds, but Kafka accepts any int64 (OffsetCommit v2-v4's retention time).
Such values are clamped to what ``timedelta`` holds.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from kio._kio_native import get_field_reader, get_reader
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.readers import Reader
from kio.static.protocol import Entity

from protocol import wire

E = TypeVar("E", bound=Entity)
_FieldReader = Callable[[wire.Buffer, int], tuple[Any, int]]


@dataclasses.dataclass(slots=True, frozen=True)
class _Plan:
    """How to read one entity type: ordered plain fields, then tagged fields by tag."""

    fields: tuple[tuple[str, _FieldReader], ...]
    tagged: dict[int, tuple[str, _FieldReader]]
    # Tagged fields whose dataclass has no default: kio's implicit default applies.
    tag_defaults: dict[str, Any]
    flexible: bool


def read_entity(entity_type: type[E], buf: wire.Buffer, pos: int) -> tuple[E, int]:
    """Read one ``entity_type`` at ``pos``; return it and the position after it.

    Raises kio's ``DecodeError`` family or ``InvalidRequestError`` on malformed input;
    the caller maps both to its own error.
    """
    plan = _plan(entity_type)
    values: dict[str, Any] = dict(plan.tag_defaults) if plan.tag_defaults else {}
    for name, reader in plan.fields:
        values[name], pos = reader(buf, pos)
    if plan.flexible:
        count, pos = wire.read_uvarint(buf, pos)
        for _ in range(count):
            tag, pos = wire.read_uvarint(buf, pos)
            size, pos = wire.read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise wire.InvalidRequestError("truncated tagged field")
            known = plan.tagged.get(tag)
            if known is not None:
                name, reader = known
                # Read from a bounded view so a lying size cannot make it overrun.
                values[name], _ = reader(memoryview(buf)[pos:end], 0)
            pos = end
    return entity_type(**values), pos


@functools.cache
def _plan(entity_type: type[Entity]) -> _Plan:
    is_header = entity_type.__name__ == "RequestHeader"
    plain: list[tuple[str, _FieldReader]] = []
    tagged: dict[int, tuple[str, _FieldReader]] = {}
    tag_defaults: dict[str, Any] = {}
    for field in dataclasses.fields(entity_type):
        tag = get_field_tag(field)
        reader = _field_reader(entity_type, field, is_header, tag is not None)
        if tag is None:
            plain.append((field.name, reader))
        else:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                tag_defaults[field.name] = get_tagged_field_default(field)
            tagged[int(tag)] = (field.name, reader)
    return _Plan(tuple(plain), tagged, tag_defaults, bool(entity_type.__flexible__))


def _field_reader(
    entity_type: type[Entity], field: dataclasses.Field[Any], is_header: bool, is_tag: bool
) -> _FieldReader:
    kind = classify_field(field)
    flexible = bool(entity_type.__flexible__)
    if isinstance(kind, EntityTupleField):
        return functools.partial(_read_array, functools.partial(read_entity, kind.type_), flexible)
    if isinstance(kind, PrimitiveTupleField):
        item_reader = get_reader(get_schema_field_type(field), flexible, False)
        return functools.partial(
            _read_array, functools.partial(_read_native, item_reader), flexible
        )
    if isinstance(kind, EntityField):
        if is_optional(field) and not is_tag:
            return functools.partial(_read_nullable_entity, kind.type_)
        return functools.partial(read_entity, kind.type_)
    if field.metadata.get("kafka_type") == "timedelta_i64" and not is_optional(field):
        return _read_duration_i64
    return functools.partial(_read_native, get_field_reader(entity_type, field, is_header, is_tag))


_I64 = struct.Struct(">q")
_MAX_DURATION_MS = int(datetime.timedelta.max.total_seconds() * 1000) // 1000 * 1000 // 2


def _read_duration_i64(buf: wire.Buffer, pos: int) -> tuple[datetime.timedelta, int]:
    if pos + 8 > len(buf):
        raise wire.InvalidRequestError("truncated int64 duration")
    (ms,) = _I64.unpack_from(buf, pos)
    ms = max(-_MAX_DURATION_MS, min(_MAX_DURATION_MS, ms))
    return datetime.timedelta(milliseconds=ms), pos + 8


def _read_native(reader: Reader[Any], buf: wire.Buffer, pos: int) -> tuple[Any, int]:
    # kio's readers return (value, bytes consumed), ours (value, new position).
    value, size = reader(buf, pos)
    return value, pos + size


def _read_array(
    read_item: _FieldReader, flexible: bool, buf: wire.Buffer, pos: int
) -> tuple[tuple[Any, ...] | None, int]:
    n, pos = wire.read_array_length(buf, pos, flexible)
    if n < 0:
        return None, pos
    if n > len(buf) - pos:
        raise wire.InvalidRequestError(f"array of {n} items in {len(buf) - pos} bytes")
    items = []
    for _ in range(n):
        item, pos = read_item(buf, pos)
        items.append(item)
    return tuple(items), pos


def _read_nullable_entity(item_type: type[Entity], buf: wire.Buffer, pos: int) -> tuple[Any, int]:
    if pos >= len(buf):
        raise wire.InvalidRequestError("truncated nullable struct marker")
    marker = buf[pos]
    if marker == 0xFF:
        return None, pos + 1
    return read_entity(item_type, buf, pos + 1)
