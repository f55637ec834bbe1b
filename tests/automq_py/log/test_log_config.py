"""LogConfig from Kafka topic property names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.config import BrokerConfig
from automq_py.log.log_config import METADATA_VERSIONS, LogConfig, metadata_version
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


# What Kafka 3.9.0's MetadataVersion.fromVersionString answers (run against kafka-server-common
# 3.9.0): each name it knows -> the version it stands for. A release alone is its last internal
# version; 0.8.0-0.9.0 have no internal versions; 4.0's are known only with their -IV suffix.
KAFKA_39_VERSIONS = {
    "0.8.0": "0.8.0", "0.8.1": "0.8.1", "0.8.2": "0.8.2", "0.9.0": "0.9.0",
    "0.10.0-IV0": "0.10.0-IV0", "0.10.0-IV1": "0.10.0-IV1", "0.10.0": "0.10.0-IV1",
    "0.10.1-IV0": "0.10.1-IV0", "0.10.1-IV1": "0.10.1-IV1", "0.10.1-IV2": "0.10.1-IV2",
    "0.10.1": "0.10.1-IV2", "0.10.2-IV0": "0.10.2-IV0", "0.10.2": "0.10.2-IV0",
    "0.11.0-IV0": "0.11.0-IV0", "0.11.0-IV1": "0.11.0-IV1", "0.11.0-IV2": "0.11.0-IV2",
    "0.11.0": "0.11.0-IV2", "1.0-IV0": "1.0-IV0", "1.0": "1.0-IV0", "1.1-IV0": "1.1-IV0",
    "1.1": "1.1-IV0", "2.0-IV0": "2.0-IV0", "2.0-IV1": "2.0-IV1", "2.0": "2.0-IV1",
    "2.1-IV0": "2.1-IV0", "2.1-IV1": "2.1-IV1", "2.1-IV2": "2.1-IV2", "2.1": "2.1-IV2",
    "2.2-IV0": "2.2-IV0", "2.2-IV1": "2.2-IV1", "2.2": "2.2-IV1", "2.3-IV0": "2.3-IV0",
    "2.3-IV1": "2.3-IV1", "2.3": "2.3-IV1", "2.4-IV0": "2.4-IV0", "2.4-IV1": "2.4-IV1",
    "2.4": "2.4-IV1", "2.5-IV0": "2.5-IV0", "2.5": "2.5-IV0", "2.6-IV0": "2.6-IV0",
    "2.6": "2.6-IV0", "2.7-IV0": "2.7-IV0", "2.7-IV1": "2.7-IV1", "2.7-IV2": "2.7-IV2",
    "2.7": "2.7-IV2", "2.8-IV0": "2.8-IV0", "2.8-IV1": "2.8-IV1", "2.8": "2.8-IV1",
    "3.0-IV0": "3.0-IV0", "3.0-IV1": "3.0-IV1", "3.0": "3.0-IV1", "3.1-IV0": "3.1-IV0",
    "3.1": "3.1-IV0", "3.2-IV0": "3.2-IV0", "3.2": "3.2-IV0", "3.3-IV0": "3.3-IV0",
    "3.3-IV1": "3.3-IV1", "3.3-IV2": "3.3-IV2", "3.3-IV3": "3.3-IV3", "3.3": "3.3-IV3",
    "3.4-IV0": "3.4-IV0", "3.4": "3.4-IV0", "3.5-IV0": "3.5-IV0", "3.5-IV1": "3.5-IV1",
    "3.5-IV2": "3.5-IV2", "3.5": "3.5-IV2", "3.6-IV0": "3.6-IV0", "3.6-IV1": "3.6-IV1",
    "3.6-IV2": "3.6-IV2", "3.6": "3.6-IV2", "3.7-IV0": "3.7-IV0", "3.7-IV1": "3.7-IV1",
    "3.7-IV2": "3.7-IV2", "3.7-IV3": "3.7-IV3", "3.7-IV4": "3.7-IV4", "3.7": "3.7-IV4",
    "3.8-IV0": "3.8-IV0", "3.8": "3.8-IV0", "3.9-IV0": "3.9-IV0", "3.9": "3.9-IV0",
    "4.0-IV0": "4.0-IV0", "4.0-IV1": "4.0-IV1",
}  # fmt: skip


def test_every_version_name_kafka_39_knows_is_read_as_kafka_reads_it() -> None:
    assert METADATA_VERSIONS == KAFKA_39_VERSIONS
    for name, version in KAFKA_39_VERSIONS.items():
        assert metadata_version(name) == version, name
        LogConfig.from_properties({"message.format.version": name})


@pytest.mark.parametrize(
    ("text", "version"),
    [
        # only the release part counts (Kafka 3.9.0's answers for each)
        ("0.10.0.0", "0.10.0-IV1"),
        ("0.8.2.1", "0.8.2"),
        ("0.9.0.1", "0.9.0"),
        ("0.10.2.2", "0.10.2-IV0"),
        ("0.11.0.3", "0.11.0-IV2"),
        ("0.10.0.1-IV0", "0.10.0-IV1"),
        ("0.10.0-IV0.1", "0.10.0-IV0"),
        ("1.0.0", "1.0-IV0"),
        ("2.0.1", "2.0-IV1"),
        ("2.8.1", "2.8-IV1"),
        ("2.8.x", "2.8-IV1"),
        ("2.8-IV1.5", "2.8-IV1"),
        ("3.8.0", "3.8-IV0"),
        ("3.9.0", "3.9-IV0"),
    ],
)
def test_longer_forms_name_their_release(text: str, version: str) -> None:
    assert metadata_version(text) == version
    assert LogConfig.from_properties({"message.format.version": text}).message_format_version == (
        text
    )
    BrokerConfig.from_properties({"log.message.format.version": text})


@pytest.mark.parametrize(
    "text",
    # each refused by Kafka 3.9.0 ("Version X is not a valid version")
    ["0.10", "0.9", "3", "4.0", "4.0-IV3", "3.0-IV9", "3.0-iv1", "2..8", ".2.8", "2.8.",
     "0.10.0.", "abc", "banana", "3.x"],
)  # fmt: skip
def test_versions_kafka_39_refuses_are_refused(text: str) -> None:
    assert metadata_version(text) is None
    with pytest.raises(ConfigError, match=r"^message\.format\.version: expected a Kafka version"):
        LogConfig.from_properties({"message.format.version": text})
    with pytest.raises(ConfigError, match=r"^log\.message\.format\.version: expected"):
        BrokerConfig.from_properties({"log.message.format.version": text})
