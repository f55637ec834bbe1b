"""Property values as Kafka's ``ConfigDef`` reads them: the one parser behind every configuration.

Each setting is declared once as a :class:`ConfigKey` (its Kafka/AutoMQ name, type, default,
bounds and description), usually as a dataclass field made by :func:`config_field`; the broker
(``automq_py.config.BrokerConfig``), the stream store (:class:`storage.config.S3StreamConfig`)
and a topic (``automq_py.log.log_config.LogConfig``) all read their properties through
:meth:`ConfigKey.parse`. A value may be a string (as written in a properties file or sent by a
client) or already a Python value of the right type.

========  ==============================================================  ===============
type      accepts (surrounding blanks are ignored, as Kafka trims)         Python value
========  ==============================================================  ===============
BOOLEAN   ``true`` or ``false``, in any case                              ``bool``
STRING    any text but the empty one; with ``choices``, one of them       ``str``
INT       ASCII decimal integer, optional sign, in -2^31 .. 2^31-1        ``int``
LONG      ASCII decimal integer, optional sign, in -2^63 .. 2^63-1        ``int``
DOUBLE    ASCII decimal number (``1``, ``0.5``, ``2e3``), finite          ``float``
LIST      comma-separated items, each stripped, empty ones dropped;       ``tuple[str]``
          with ``choices``, at least one item and each one of them
          (matched in any case, kept lower-cased)
========  ==============================================================  ===============

Numbers are then held to ``minimum`` / ``maximum`` (inclusive) and ``positive``; a key's
``check`` states any rule these cannot (one of Kafka's custom validators). Every failure
is a :class:`ConfigError` whose message starts with the property's name (``segment.bytes:
must be at least 14, got 10``), whatever the input; nothing else escapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# more digits than any long has: refused before int() (which caps the digits it converts)
_MAX_DIGITS = 20


class ConfigError(ValueError):
    """A property is missing, malformed or out of range; the message names it."""


class ConfigType(IntEnum):
    """A property's type; the numbers are DescribeConfigs' ``config_type`` codes."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


@dataclass(slots=True, frozen=True)
class ConfigKey:
    """One property: its name, type, default, bounds and description."""

    name: str
    type: ConfigType
    default: Any
    doc: str = ""
    minimum: int | float | None = None
    maximum: int | float | None = None
    positive: bool = False  # a number above zero (for DOUBLE, where "at least" cannot say it)
    choices: tuple[str, ...] = ()
    # a rule the bounds cannot say (Kafka's custom validators): the value -> what is wrong
    # with it, or None when it is valid
    check: Callable[[Any], str | None] | None = None

    def parse(self, raw: object) -> Any:
        """``raw`` as this key's Python value (see the module docstring); raises
        :class:`ConfigError` naming the property."""
        value = self._parse_type(raw)
        if self.check is not None:
            problem = self.check(value)
            if problem is not None:
                raise ConfigError(f"{self.name}: {problem}, got {raw!r}")
        return value

    def _parse_type(self, raw: object) -> Any:
        if self.type is ConfigType.BOOLEAN:
            return _boolean(self, raw)
        if self.type in (ConfigType.INT, ConfigType.LONG):
            return _bounded(self, _integer(self, raw))
        if self.type is ConfigType.DOUBLE:
            return _bounded(self, _double(self, raw))
        if self.type is ConfigType.LIST:
            return _list(self, raw)
        return _string(self, raw)


def format_value(value: Any) -> str:
    """A parsed value written back as a property string (what DescribeConfigs shows)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def split_list(text: str) -> tuple[str, ...]:
    """The items of a LIST value: split at commas, each stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def config_field(
    name: str,
    default: Any,
    type: ConfigType,
    doc: str,
    *,
    minimum: int | float | None = None,
    maximum: int | float | None = None,
    positive: bool = False,
    choices: tuple[str, ...] = (),
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A dataclass field holding property ``name``; :func:`declared_keys` finds it."""
    key = ConfigKey(name, type, default, doc, minimum, maximum, positive, choices, check)
    return field(default=default, metadata={"config_key": key})


def declared_keys(cls: type) -> dict[str, tuple[str, ConfigKey]]:
    """Property name -> (attribute, key) for every :func:`config_field` of dataclass ``cls``."""
    return {
        f.metadata["config_key"].name: (f.name, f.metadata["config_key"])
        for f in fields(cls)
        if "config_key" in f.metadata
    }


def parse_declared(
    cls: type, props: Mapping[str, object], *, strict: bool = False
) -> dict[str, Any]:
    """Attribute -> parsed value for each property of ``props`` that dataclass ``cls``
    declares; the others are ignored, or with ``strict`` refused. Raises :class:`ConfigError`
    naming the first bad property."""
    keys = declared_keys(cls)
    values: dict[str, Any] = {}
    for name, raw in props.items():
        found = keys.get(name)
        if found is None:
            if strict:
                raise ConfigError(f"unknown property {name!r}")
            continue
        attr, key = found
        values[attr] = key.parse(raw)
    return values


# --- one function per type ------------------------------------------------------------------


def _text(raw: object) -> str:
    return str(raw).strip()


def _boolean(key: ConfigKey, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = _text(raw).lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{key.name}: expected true or false, got {raw!r}")
    return text == "true"


def _integer(key: ConfigKey, raw: object) -> int:
    if isinstance(raw, bool):  # a bool is an int to Python, not to a config
        raise ConfigError(f"{key.name}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    else:
        text = _text(raw)
        if _INTEGER.fullmatch(text) is None:
            raise ConfigError(f"{key.name}: expected an integer, got {raw!r}")
        if len(text.lstrip("+-0")) > _MAX_DIGITS:
            raise _does_not_fit(key, text)
        value = int(text)
    low, high = (INT_MIN, INT_MAX) if key.type is ConfigType.INT else (LONG_MIN, LONG_MAX)
    if not low <= value <= high:
        raise _does_not_fit(key, value)
    return value


def _does_not_fit(key: ConfigKey, value: object) -> ConfigError:
    return ConfigError(f"{key.name}: must fit in a {key.type.name.lower()}, got {value}")


def _double(key: ConfigKey, raw: object) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    else:
        text = _text(raw)
        if _DECIMAL.fullmatch(text) is None:
            raise ConfigError(f"{key.name}: expected a number, got {raw!r}")
        value = float(text)
    if not math.isfinite(value):
        raise ConfigError(f"{key.name}: expected a finite number, got {raw!r}")
    return value


def _bounded(key: ConfigKey, value: int | float) -> Any:
    if key.positive and value <= 0:
        raise ConfigError(f"{key.name}: must be positive, got {value}")
    if key.minimum is not None and value < key.minimum:
        raise ConfigError(f"{key.name}: must be at least {key.minimum}, got {value}")
    if key.maximum is not None and value > key.maximum:
        raise ConfigError(f"{key.name}: must be at most {key.maximum}, got {value}")
    return value


def _list(key: ConfigKey, raw: object) -> tuple[str, ...]:
    items = raw if isinstance(raw, (list, tuple)) else [str(raw)]
    values = tuple(v for item in items for v in split_list(str(item)))
    if not key.choices:
        return values
    # any case, kept lower-cased, as LogConfig always read cleanup.policy (Kafka's validator
    # wants lower case, but Kafka lower-cases the value again where it acts on it)
    values = tuple(v.lower() for v in values)
    if not values or any(v not in key.choices for v in values):
        raise ConfigError(
            f"{key.name}: expected a comma-separated list of {', '.join(key.choices)}, got {raw!r}"
        )
    return values


def _string(key: ConfigKey, raw: object) -> str:
    text = _text(raw)
    if key.choices and text not in key.choices:
        raise ConfigError(f"{key.name}: expected one of {', '.join(key.choices)}, got {raw!r}")
    if not text:
        raise ConfigError(f"{key.name}: must not be empty")
    return text
