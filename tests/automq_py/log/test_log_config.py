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
        ({"compression.gzip.level": "0"}, "compression.gzip.level: must be -1 or in 1..9"),
        ({"compression.zstd.level": "23"}, "compression.zstd.level: must be at most 22"),
        ({"segment.index.bytes": "3"}, "segment.index.bytes: must be at least 4"),
        ({"follower.replication.throttled.replicas": "0:x"}, "follower.replication"),
        ({"message.format.version": "3.x"}, "message.format.version: expected a Kafka"),
        ({"remote.storage.enable": "true"}, "^remote.storage.enable: Tiered Storage"),
        (
            {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "9"},
            r"^min.compaction.lag.ms: conflict .* \(10\) > max.compaction.lag.ms \(9\)",
        ),
    ],
)
def test_errors_name_the_property(props: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LogConfig.from_properties(props)


def test_kafka_39_topic_configs_and_their_defaults() -> None:
    """Every topic config Kafka 3.9 defines, with Kafka's default."""
    c = LogConfig()
    defaults = {name: getattr(c, attr) for name, (attr, _) in LogConfig.properties().items()}
    long_max = (1 << 63) - 1
    assert defaults == {
        "cleanup.policy": ("delete",),
        "compression.type": "producer",
        "compression.gzip.level": -1,
        "compression.lz4.level": 9,
        "compression.zstd.level": 3,
        "delete.retention.ms": 86_400_000,
        "file.delete.delay.ms": 60_000,
        "flush.messages": long_max,
        "flush.ms": long_max,
        "follower.replication.throttled.replicas": (),
        "index.interval.bytes": 4096,
        "leader.replication.throttled.replicas": (),
        "local.retention.bytes": -2,
        "local.retention.ms": -2,
        "max.compaction.lag.ms": long_max,
        "max.message.bytes": 1048588,
        "message.downconversion.enable": True,
        "message.format.version": "3.0-IV1",
        "message.timestamp.after.max.ms": long_max,
        "message.timestamp.before.max.ms": long_max,
        "message.timestamp.difference.max.ms": long_max,
        "message.timestamp.type": "CreateTime",
        "min.cleanable.dirty.ratio": 0.5,
        "min.compaction.lag.ms": 0,
        "min.insync.replicas": 1,
        "preallocate": False,
        "remote.log.copy.disable": False,
        "remote.log.delete.on.disable": False,
        "remote.storage.enable": False,
        "retention.bytes": -1,
        "retention.ms": 604_800_000,
        "segment.bytes": 1 << 30,
        "segment.index.bytes": 10 << 20,
        "segment.jitter.ms": 0,
        "segment.ms": 604_800_000,
        "unclean.leader.election.enable": False,
    }


def test_timestamp_bounds_fall_back_to_the_deprecated_difference() -> None:
    c = LogConfig.from_properties({"message.timestamp.difference.max.ms": "1000"})
    assert (c.timestamp_before_max_ms, c.timestamp_after_max_ms) == (1000, 1000)
    c = LogConfig.from_properties(
        {"message.timestamp.difference.max.ms": "1000", "message.timestamp.after.max.ms": "5"}
    )
    assert (c.timestamp_before_max_ms, c.timestamp_after_max_ms) == (1000, 5)
    assert LogConfig.from_properties({"segment.index.bytes": "4"}).max_time_index_entries == 1


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
