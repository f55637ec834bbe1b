"""LogConfig: a partition log's settings, read once from Kafka topic property names.

Built from ``name -> value`` by :meth:`LogConfig.from_properties`; a topic's configs layered
over the broker's defaults are :func:`automq_py.topic_config.effective_topic_config`'s job.
Every value goes through the one property parser (:mod:`storage.config_def`), so every error
is a :class:`ConfigError` naming the property at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.config_def import (
    LONG_MAX,
    ConfigKey,
    ConfigType,
    config_field,
    declared_keys,
    parse_declared,
)

DAY_MS = 24 * 3600 * 1000

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("delete", "compact")
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


def _int(name: str, default: int, minimum: int, doc: str) -> Any:
    return config_field(name, default, ConfigType.INT, doc, minimum=minimum)


def _long(name: str, default: int, minimum: int, doc: str) -> Any:
    return config_field(name, default, ConfigType.LONG, doc, minimum=minimum)


@dataclass(slots=True, frozen=True)
class LogConfig:
    """A topic's log settings; the types are Kafka's (INT or LONG) for DescribeConfigs."""

    segment_bytes: int = _int("segment.bytes", 1 << 30, 14, "roll a segment at this size")
    segment_ms: int = _long("segment.ms", 7 * DAY_MS, 1, "roll a segment after this long")
    segment_jitter_ms: int = _long("segment.jitter.ms", 0, 0, "random jitter off segment.ms")
    segment_index_bytes: int = _int(
        "segment.index.bytes", 10 << 20, 12, "time index bytes per segment; full -> roll"
    )
    index_interval_bytes: int = _int(
        "index.interval.bytes", 4096, 0, "log bytes between two time index entries"
    )
    retention_ms: int = _long("retention.ms", 7 * DAY_MS, -1, "keep data this long (-1: ever)")
    retention_bytes: int = _long(
        "retention.bytes", -1, -1, "keep at most this many bytes (-1: no limit)"
    )
    max_message_bytes: int = _int("max.message.bytes", 1048588, 0, "largest record batch accepted")
    message_timestamp_type: str = config_field(
        "message.timestamp.type",
        "CreateTime",
        ConfigType.STRING,
        "CreateTime or LogAppendTime",
        choices=TIMESTAMP_TYPES,
    )
    message_timestamp_before_max_ms: int = _long(
        "message.timestamp.before.max.ms", LONG_MAX, 0, "oldest timestamp accepted, from now"
    )
    message_timestamp_after_max_ms: int = _long(
        "message.timestamp.after.max.ms", LONG_MAX, 0, "newest timestamp accepted, from now"
    )
    cleanup_policy: tuple[str, ...] = config_field(
        "cleanup.policy",
        ("delete",),
        ConfigType.LIST,
        "comma-separated: delete, compact",
        choices=CLEANUP_POLICIES,
    )
    delete_retention_ms: int = _long(
        "delete.retention.ms", DAY_MS, 0, "compacted topics keep tombstones this long"
    )
    min_cleanable_dirty_ratio: float = config_field(
        "min.cleanable.dirty.ratio",
        0.5,
        ConfigType.DOUBLE,
        "compact once this share of the log is not compacted yet",
        minimum=0,
        maximum=1,
    )
    min_compaction_lag_ms: int = _long(
        "min.compaction.lag.ms", 0, 0, "a record stays uncompacted at least this long"
    )
    max_compaction_lag_ms: int = _long(
        "max.compaction.lag.ms", LONG_MAX, 1, "a record is compacted within this long"
    )
    compression_type: str = config_field(
        "compression.type",
        "producer",
        ConfigType.STRING,
        "codec the log stores (producer: as sent)",
        choices=COMPRESSION_TYPES,
    )

    @property
    def max_time_index_entries(self) -> int:
        """Entries a segment's time index holds before the segment must roll (Kafka's rule)."""
        return self.segment_index_bytes // 12

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @classmethod
    def properties(cls) -> dict[str, tuple[str, ConfigKey]]:
        """Property name -> (attribute, key)."""
        return declared_keys(cls)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], *, strict: bool = False) -> LogConfig:
        """Build from ``name -> value`` (strings or Python values); unknown names are ignored
        unless ``strict``. Raises :class:`ConfigError` naming the property at fault."""
        return cls(**parse_declared(cls, props, strict=strict))
