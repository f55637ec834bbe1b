"""LogConfig from Kafka topic property names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.log.log_config import LogConfig
from storage.config_def import ConfigError
from tests.storage.test_config_def import raw_text


def test_defaults_are_kafkas() -> None:
    c = LogConfig()
    assert (c.segment_bytes, c.segment_ms, c.index_interval_bytes) == (1 << 30, 604800000, 4096)
    assert (c.retention_ms, c.retention_bytes) == (604800000, -1)
    assert c.message_timestamp_type == "CreateTime" and c.cleanup_policy == ("delete",)
    assert c.max_time_index_entries == (10 << 20) // 12


def test_from_properties_parses_strings_and_values() -> None:
    c = LogConfig.from_properties(
        {
            "segment.bytes": "2000",
            "segment.ms": 60000,
            "retention.ms": "-1",
            "cleanup.policy": "compact, delete",
            "message.timestamp.type": "LogAppendTime",
            "some.broker.property": "ignored",
        }
    )
    assert (c.segment_bytes, c.segment_ms, c.retention_ms) == (2000, 60000, -1)
    assert c.cleanup_policy == ("compact", "delete") and c.compact
    assert c.message_timestamp_type == "LogAppendTime"


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"segment.bytes": "big"}, "segment.bytes: expected an integer"),
        ({"segment.bytes": "10"}, "segment.bytes: must be at least 14"),
        ({"retention.ms": "-2"}, "retention.ms: must be at least -1"),
        ({"index.interval.bytes": True}, "index.interval.bytes"),
        ({"message.timestamp.type": "Now"}, "message.timestamp.type: expected one of"),
        ({"cleanup.policy": "delete,forever"}, "cleanup.policy"),
        ({"cleanup.policy": ""}, "cleanup.policy"),
    ],
)
def test_errors_name_the_property(props: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LogConfig.from_properties(props)


def test_strict_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match=r"segment\.byte"):
        LogConfig.from_properties({"segment.byte": "1"}, strict=True)


@given(st.sampled_from(sorted(LogConfig.properties())), raw_text)
def test_any_topic_property_value_gives_a_log_config_or_an_error_naming_it(
    name: str, raw: str
) -> None:
    try:
        LogConfig.from_properties({name: raw}, strict=True)
    except ConfigError as e:
        assert str(e).startswith(f"{name}: ")
