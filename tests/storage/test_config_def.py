"""The one property parser: each type's rules, and that no input gets anything out of it but a
value of the declared type or a ConfigError naming the property."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.config import S3StreamConfig
from storage.config_def import (
    INT_MAX,
    LONG_MAX,
    ConfigError,
    ConfigKey,
    ConfigType,
    config_field,
    declared_keys,
    format_value,
    parse_declared,
)

PYTHON_TYPES = {
    ConfigType.BOOLEAN: bool,
    ConfigType.STRING: str,
    ConfigType.INT: int,
    ConfigType.LONG: int,
    ConfigType.DOUBLE: float,
    ConfigType.LIST: tuple,
}


def key(type: ConfigType, **bounds: Any) -> ConfigKey:
    return ConfigKey("some.property", type, None, **bounds)


@pytest.mark.parametrize(
    ("type", "raw", "expected"),
    [
        (ConfigType.BOOLEAN, " TRUE ", True),
        (ConfigType.BOOLEAN, "false", False),
        (ConfigType.BOOLEAN, False, False),
        (ConfigType.STRING, "  spaced  ", "spaced"),
        (ConfigType.INT, "+42", 42),
        (ConfigType.INT, str(INT_MAX), INT_MAX),
        (ConfigType.INT, "-7", -7),
        (ConfigType.INT, 12, 12),
        (ConfigType.LONG, str(LONG_MAX), LONG_MAX),
        (ConfigType.LONG, "00000000000000000000000001", 1),
        (ConfigType.DOUBLE, "0.5", 0.5),
        (ConfigType.DOUBLE, "2e3", 2000.0),
        (ConfigType.DOUBLE, ".25", 0.25),
        (ConfigType.DOUBLE, 3, 3.0),
        (ConfigType.LIST, " a , b,,c ", ("a", "b", "c")),
        (ConfigType.LIST, "", ()),
        (ConfigType.LIST, ["x", " y "], ("x", "y")),
    ],
)
def test_each_type_parses_what_kafka_accepts(type: ConfigType, raw: object, expected: Any) -> None:
    assert key(type).parse(raw) == expected


@pytest.mark.parametrize(
    ("parsed", "raw", "message"),
    [
        (key(ConfigType.BOOLEAN), "yes", "expected true or false, got 'yes'"),
        (key(ConfigType.STRING), "  ", "must not be empty"),
        (key(ConfigType.INT), "1.5", "expected an integer, got '1.5'"),
        (key(ConfigType.INT), "1_000", "expected an integer"),  # Python's int() takes it
        (key(ConfigType.INT), "\u0661", "expected an integer"),  # so does an Arabic-Indic 1
        (key(ConfigType.INT), True, "expected an integer, got True"),
        (key(ConfigType.INT), str(INT_MAX + 1), "must fit in a int"),
        (key(ConfigType.LONG), str(LONG_MAX + 1), "must fit in a long"),
        (key(ConfigType.LONG), "9" * 5000, "must fit in a long"),  # beyond int()'s digit cap
        (key(ConfigType.DOUBLE), "nan", "expected a number, got 'nan'"),
        (key(ConfigType.DOUBLE), "1e999", "expected a finite number"),
        (key(ConfigType.DOUBLE), float("inf"), "expected a finite number"),
        (key(ConfigType.INT, minimum=14), "10", "must be at least 14, got 10"),
        (key(ConfigType.LONG, maximum=5), "6", "must be at most 5, got 6"),
        (key(ConfigType.DOUBLE, positive=True), "0", "must be positive, got 0.0"),
        (key(ConfigType.STRING, choices=("A", "B")), "a", "expected one of A, B, got 'a'"),
        (key(ConfigType.LIST, choices=("x", "y")), "x,z", "list of x, y, got 'x,z'"),
        (key(ConfigType.LIST, choices=("x", "y")), " , ", "list of x, y"),
    ],
)
def test_errors_start_with_the_property_name(parsed: ConfigKey, raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match="^some\\.property: " + ".*" + re.escape(message)):
        parsed.parse(raw)


def test_a_list_with_choices_is_matched_in_any_case_and_kept_lower_cased() -> None:
    assert key(ConfigType.LIST, choices=("delete", "compact")).parse("Compact,DELETE") == (
        "compact",
        "delete",
    )


def test_format_value_writes_back_what_parse_reads() -> None:
    for type, value in [
        (ConfigType.BOOLEAN, True),
        (ConfigType.INT, -3),
        (ConfigType.DOUBLE, 0.25),
        (ConfigType.LIST, ("a", "b")),
        (ConfigType.STRING, "x y"),
    ]:
        assert key(type).parse(format_value(value)) == value


@dataclass(slots=True, frozen=True)
class Example:
    size: int = config_field("example.size", 10, ConfigType.LONG, "a size", minimum=1)
    flag: bool = config_field("example.flag", False, ConfigType.BOOLEAN, "a flag")


def test_declared_fields_are_found_and_parsed_by_property_name() -> None:
    keys = declared_keys(Example)
    assert {name: attr for name, (attr, _) in keys.items()} == {
        "example.size": "size",
        "example.flag": "flag",
    }
    assert keys["example.size"][1].doc == "a size"
    values = parse_declared(Example, {"example.size": "3", "other": "x"})
    assert Example(**values) == Example(size=3)
    with pytest.raises(ConfigError, match="unknown property 'other'"):
        parse_declared(Example, {"other": "x"}, strict=True)
    with pytest.raises(ConfigError, match=r"^example\.size: must be at least 1"):
        parse_declared(Example, {"example.size": "0"})


# --- fuzz: any input, a value of the declared type or a clean error ----------------------------

keys = st.builds(
    ConfigKey,
    name=st.sampled_from(["a.b", "segment.bytes", "s3.wal.capacity"]),
    type=st.sampled_from(list(ConfigType)),
    default=st.none(),
    minimum=st.none() | st.integers(-5, 5),
    maximum=st.none() | st.integers(-5, 5),
    positive=st.booleans(),
    choices=st.sampled_from([(), ("x", "y"), ("CreateTime", "LogAppendTime")]),
)
# pieces of the shapes property parsers look for (numbers, lists, listeners, urls)
_TOKENS = ["PLAINTEXT", "CONTROLLER", "://", ":", ",", " ", "0", "-1", "9092", "1.5", "e9"]
_TOKENS += ["[::1]", "0.0.0.0", "h", "true", "False", "x", "compact", "s3://b", "file:///", "@"]
# text around those shapes, and anything at all: what a fuzz test feeds a property
raw_text = st.one_of(
    st.text(),
    st.from_regex(r"\s*[+-]?[0-9]{0,30}(\.[0-9]*)?([eE][+-]?[0-9]{1,4})?\s*", fullmatch=True),
    st.lists(st.sampled_from(_TOKENS), max_size=8).map("".join),
)
raw_values = st.one_of(
    raw_text,
    st.integers(),
    st.floats(),
    st.booleans(),
    st.lists(st.text(max_size=5), max_size=4),
)


@given(keys, raw_values)
def test_any_value_parses_to_the_declared_type_or_fails_naming_the_property(
    parsed: ConfigKey, raw: object
) -> None:
    try:
        value = parsed.parse(raw)
    except ConfigError as e:
        assert str(e).startswith(f"{parsed.name}: ")
        return
    assert isinstance(value, PYTHON_TYPES[parsed.type])
    assert not isinstance(value, bool) or parsed.type is ConfigType.BOOLEAN


@given(st.sampled_from(sorted(S3StreamConfig.properties())), raw_text)
def test_any_storage_property_value_gives_a_config_or_an_error_naming_it(
    name: str, raw: str
) -> None:
    try:
        S3StreamConfig.from_properties({name: raw})
    except ConfigError as e:
        assert name in str(e)
