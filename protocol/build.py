"""Build kio messages of any version from one plain description.

Handlers describe a response once, as nested dicts keyed by kio's field names (Kafka's JSON
names in snake case: ``throttle_time``, ``error_code``, ``partition_index``...). ``build`` fits
that description to the schema class of the negotiated version: fields the version lacks are
ignored, fields it has but the description omits take the schema default (or a zero value), and
plain values are converted to what kio's writers expect (``timedelta`` for durations, the error
code enum, ``UUID`` for topic ids, tuples of nested entities for arrays).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from protocol.errors import ErrorCode

E = TypeVar("E")

_ZERO_UUID = uuid.UUID(int=0)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, str | None, bool], ...]:
    """(name, type hint, kafka_type, has default) for each field of a kio entity class."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        out.append((f.name, hints[f.name], f.metadata.get("kafka_type"), has_default))
    return tuple(out)


def build(cls: type[E], data: Mapping[str, Any]) -> E:
    """An instance of kio entity ``cls`` from ``data`` (missing fields default)."""
    kwargs: dict[str, Any] = {}
    for name, hint, kafka_type, has_default in _fields(cls):  # type: ignore[arg-type]
        if name in data:
            kwargs[name] = _convert(hint, kafka_type, data[name])
        elif not has_default:
            kwargs[name] = _zero(hint, kafka_type)
    return cls(**kwargs)


def _entity_of(hint: Any) -> type | None:
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the hint without None, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def _convert(hint: Any, kafka_type: str | None, value: Any) -> Any:
    inner, nullable = _optional(hint)
    if value is None:
        return None if nullable else _zero(hint, kafka_type)
    if typing.get_origin(inner) is tuple:
        (item_hint, *_) = typing.get_args(inner)
        return tuple(_convert(item_hint, kafka_type, v) for v in value)
    entity = _entity_of(inner)
    if entity is not None:
        return value if isinstance(value, entity) else build(entity, value)
    if kafka_type in ("timedelta_i32", "timedelta_i64") and not isinstance(
        value, datetime.timedelta
    ):
        return datetime.timedelta(milliseconds=int(value))
    if kafka_type == "error_code":
        return ErrorCode(int(value))
    if kafka_type == "datetime_i64" and isinstance(value, int):
        # Kafka's "no time" is -1
        if value < 0:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if kafka_type == "uuid":
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return value


def _zero(hint: Any, kafka_type: str | None) -> Any:
    inner, nullable = _optional(hint)
    if typing.get_origin(inner) is tuple:
        return ()
    if nullable:
        return None
    if _entity_of(inner) is not None:
        return build(inner, {})
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "error_code":
        return ErrorCode.NONE
    if kafka_type == "uuid":
        return _ZERO_UUID
    if kafka_type == "bool":
        return False
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "float64":
        return 0.0
    return 0
