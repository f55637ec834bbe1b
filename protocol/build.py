"""Build kio messages of any version from one plain description.

Handlers describe a response once, as nested dicts keyed by kio's field names (Kafka's JSON
names in snake case: ``throttle_time``, ``error_code``, ``partition_index``...). ``build`` fits
that description to the schema class of the negotiated version: fields the version lacks are
ignored, fields it has but the description omits take the schema default (or a zero value), and
plain values are converted to what kio's writers expect (``timedelta`` for durations, the error
code enum, ``UUID`` for topic ids, tuples of nested entities for arrays).

A name that no version of the message has is a mistake in the description (a typo would
otherwise leave the field at its default without a word): ``build`` raises
``UnknownFieldError`` naming it and the schema.

Each class's fields are compiled once into a plan (name, converter, zero value); ``build`` then
only looks values up and calls the converters the fields need, because it is on the Produce
path.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import pkgutil
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from protocol.errors import ErrorCode

E = TypeVar("E")

ZERO_UUID = uuid.UUID(int=0)

Converter = Callable[[Any], Any]


class UnknownFieldError(ValueError):
    """A description names a field that no version of the schema has."""

    def __init__(self, cls: type, names: list[str], known: frozenset[str]) -> None:
        where = f"{cls.__module__}.{cls.__qualname__}"
        super().__init__(
            f"{where} has no field {', '.join(map(repr, names))} in any version"
            f" (its fields: {', '.join(sorted(known))})"
        )
        self.schema = cls
        self.names = names


@dataclasses.dataclass(slots=True, frozen=True)
class _Field:
    """How ``build`` fills one field of a class."""

    name: str
    convert: Converter | None  # applied to a non-None value; None: stored as given
    nullable: bool
    zero: Any  # for None on a non-nullable field, and for an omitted field without default
    required: bool  # no schema default: an omitted field gets ``zero``


@dataclasses.dataclass(slots=True, frozen=True)
class _Plan:
    fields: tuple[_Field, ...]
    own: frozenset[str]  # the field names of this version


def build(cls: type[E], data: Mapping[str, Any]) -> E:
    """An instance of kio entity ``cls`` from ``data`` (missing fields default).

    Raises ``UnknownFieldError`` if ``data`` names a field that no version of ``cls`` has.
    """
    plan = _plan(cls)  # type: ignore[arg-type]  # a class is hashable
    if not plan.own.issuperset(data):
        # names of other versions are dropped; only then are those versions loaded
        known = _names_in_every_version(cls)  # type: ignore[arg-type]
        if not known.issuperset(data):
            names = sorted(name for name in data if name not in known)
            raise UnknownFieldError(cls, names, known)
    kwargs: dict[str, Any] = {}
    for f in plan.fields:
        if f.name in data:
            value = data[f.name]
            if value is None:
                kwargs[f.name] = None if f.nullable else f.zero
            elif f.convert is None:
                kwargs[f.name] = value
            else:
                kwargs[f.name] = f.convert(value)
        elif f.required:
            kwargs[f.name] = f.zero
    return cls(**kwargs)


def plan(cls: type) -> None:
    """Prepare ``build`` for kio entity ``cls`` (and the entities it nests) ahead of use."""
    _plan(cls)


def field_names(cls: type) -> frozenset[str]:
    """Every field name that some version of kio entity ``cls`` has (what ``build`` accepts)."""
    return _names_in_every_version(cls)


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        convert, nullable, zero = _compile(hints[f.name], kafka_type)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append(_Field(f.name, convert, nullable, zero, required))
    return _Plan(tuple(fields), frozenset(f.name for f in fields))


@functools.cache
def _versions(message: str) -> tuple[str, ...]:
    """The version packages (``v0``, ``v1``...) of kio message package ``message``; listed once
    per message, not once per struct (a directory scan each time)."""
    path = importlib.import_module(message).__path__
    return tuple(
        info.name
        for info in pkgutil.iter_modules(path)
        if info.name.startswith("v") and info.name[1:].isdigit()
    )


@functools.cache
def _names_in_every_version(cls: type) -> frozenset[str]:
    """The field names of ``cls`` and of its namesakes in the other versions of its message.

    kio generates one module per version (``kio.schema.<message>.v<N>.<kind>``) with one class
    per struct, named as in Kafka's JSON schema.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    parts = cls.__module__.split(".")
    if len(parts) != 5 or parts[:2] != ["kio", "schema"]:
        return frozenset(names)
    message = ".".join(parts[:3])
    for version in _versions(message):
        try:
            module = importlib.import_module(f"{message}.{version}.{parts[4]}")
        except ImportError:
            continue
        other = getattr(module, cls.__name__, None)
        if isinstance(other, type) and dataclasses.is_dataclass(other):
            names.update(f.name for f in dataclasses.fields(other))
    return frozenset(names)


def _entity_of(hint: Any) -> type | None:
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the hint without None, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def _compile(hint: Any, kafka_type: str | None) -> tuple[Converter | None, bool, Any]:
    """(converter of a non-None value or None, nullable, zero value) for a field's type."""
    inner, nullable = _optional(hint)
    zero = _zero(inner, nullable, kafka_type)
    if typing.get_origin(inner) is tuple:
        (item_hint, *_) = typing.get_args(inner)
        item = _compile(item_hint, kafka_type)
        return _array(*item), nullable, zero
    entity = _entity_of(inner)
    if entity is not None:
        return _entity(entity), nullable, zero
    convert = _CONVERTERS.get(kafka_type) if kafka_type is not None else None
    return convert, nullable, zero


def _array(convert: Converter | None, nullable: bool, zero: Any) -> Converter:
    if convert is None:
        if nullable:
            return tuple
        return lambda values: tuple(zero if v is None else v for v in values)

    def items(values: Any) -> tuple[Any, ...]:
        return tuple(((None if nullable else zero) if v is None else convert(v)) for v in values)

    return items


def _entity(entity: type) -> Converter:
    def convert(value: Any) -> Any:
        return value if isinstance(value, entity) else build(entity, value)

    return convert


def _timedelta(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=int(value))


def _error_code(value: Any) -> ErrorCode:
    return value if type(value) is ErrorCode else ErrorCode(int(value))


def _datetime(value: Any) -> Any:
    if not isinstance(value, int):
        return value
    # Kafka's "no time" is -1
    if value < 0:
        return None
    return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


_CONVERTERS: dict[str, Converter] = {
    "timedelta_i32": _timedelta,
    "timedelta_i64": _timedelta,
    "error_code": _error_code,
    "datetime_i64": _datetime,
    "uuid": _uuid,
}


def _zero(inner: Any, nullable: bool, kafka_type: str | None) -> Any:
    if typing.get_origin(inner) is tuple:
        return ()
    if nullable:
        return None
    entity = _entity_of(inner)
    if entity is not None:
        return build(entity, {})  # kio entities are frozen: one instance serves every use
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "error_code":
        return ErrorCode.NONE
    if kafka_type == "uuid":
        return ZERO_UUID
    if kafka_type == "bool":
        return False
    if kafka_type == "string":
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "float64":
        return 0.0
    return 0
