"""LogConfig: a partition log's settings, read once from Kafka topic property names.

Built from ``name -> value`` by :meth:`LogConfig.from_properties`; a topic's configs layered
over the broker's defaults are :func:`automq_py.topic_config.effective_topic_config`'s job.
Every value goes through the one property parser (:mod:`storage.config_def`), so every error
is a :class:`ConfigError` naming the property at fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.config_def import (
    LONG_MAX,
    ConfigError,
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


def _gzip_level(level: int) -> str | None:
    return None if level == -1 or 1 <= level <= 9 else "must be -1 or in 1..9"


def _format_version(version: str) -> str | None:
    if metadata_version(version) is not None:
        return None
    return "expected a Kafka version such as 3.0-IV1, 2.8 or 0.10.0.0"


# Kafka 3.9's MetadataVersion (the old inter-broker protocol versions): each release with how
# many internal versions (-IV0, -IV1, ...) it has; the releases before 0.10.0 have none. The
# 4.0 internal versions exist in 3.9 (unstable), but "4.0" alone does not name one there.
_RELEASES: tuple[tuple[str, int], ...] = (
    ("0.8.0", 0), ("0.8.1", 0), ("0.8.2", 0), ("0.9.0", 0),
    ("0.10.0", 2), ("0.10.1", 3), ("0.10.2", 1), ("0.11.0", 3),
    ("1.0", 1), ("1.1", 1), ("2.0", 2), ("2.1", 3), ("2.2", 2), ("2.3", 2), ("2.4", 2),
    ("2.5", 1), ("2.6", 1), ("2.7", 3), ("2.8", 2),
    ("3.0", 2), ("3.1", 1), ("3.2", 1), ("3.3", 4), ("3.4", 1), ("3.5", 3), ("3.6", 3),
    ("3.7", 5), ("3.8", 1), ("3.9", 1),
)  # fmt: skip
_UNSTABLE = ("4.0-IV0", "4.0-IV1")


def _version_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for release, internal in _RELEASES:
        versions = [f"{release}-IV{i}" for i in range(internal)] or [release]
        names.update((v, v) for v in versions)
        names[release] = versions[-1]  # a release alone: its last internal version
    names.update((v, v) for v in _UNSTABLE)
    return names


# every name MetadataVersion.fromVersionString knows -> the version it names
METADATA_VERSIONS: dict[str, str] = _version_names()


def metadata_version(text: str) -> str | None:
    """The version ``text`` names, as Kafka 3.9's ``MetadataVersion.fromVersionString`` reads
    it (``message.format.version``'s validator), or None. Only the release part counts: three
    dot-separated parts for a 0.x version, two after, so ``0.10.0.0`` is ``0.10.0`` (its last
    internal version, ``0.10.0-IV1``) and ``2.8.1`` is ``2.8``."""
    parts = text.split(".")
    while parts and not parts[-1]:
        parts.pop()  # as Java's String.split drops trailing empty strings
    count = 3 if text.startswith("0.") else 2
    key = text if count >= len(parts) else ".".join(parts[:count])
    return METADATA_VERSIONS.get(key)


def _throttled_replicas(items: tuple[str, ...]) -> str | None:
    """Kafka's ThrottledReplicaListValidator: ``*`` alone, or ``partition:broker`` pairs."""
    if items == ("*",) or all(_THROTTLED_REPLICA.fullmatch(item) for item in items):
        return None
    return "expected * or a list of partition:broker pairs"


_THROTTLED_REPLICA = re.compile(r"[0-9]+\s*:\s*[0-9]+")


@dataclass(slots=True, frozen=True)
class LogConfig:
    """A topic's log settings: every topic config Kafka 3.9 defines, with its type (INT or
    LONG, for DescribeConfigs), default and bounds. The ones marked "accepted" are kept and
    described but change nothing here (replication, page cache, tiered-storage and
    message-format settings that an object-storage log has no use for)."""

    segment_bytes: int = _int("segment.bytes", 1 << 30, 14, "roll a segment at this size")
    segment_ms: int = _long("segment.ms", 7 * DAY_MS, 1, "roll a segment after this long")
    segment_jitter_ms: int = _long("segment.jitter.ms", 0, 0, "random jitter off segment.ms")
    segment_index_bytes: int = _int(
        "segment.index.bytes", 10 << 20, 4, "time index bytes per segment; full -> roll"
    )
    index_interval_bytes: int = _int(
        "index.interval.bytes", 4096, 0, "log bytes between two time index entries"
    )
    retention_ms: int = _long("retention.ms", 7 * DAY_MS, -1, "keep data this long (-1: ever)")
    retention_bytes: int = config_field(
        "retention.bytes", -1, ConfigType.LONG, "keep at most this many bytes (negative: no limit)"
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
    message_timestamp_difference_max_ms: int = _long(
        "message.timestamp.difference.max.ms",
        LONG_MAX,
        0,
        "deprecated: both timestamp bounds, where before/after.max.ms are not set",
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
    compression_gzip_level: int = config_field(
        "compression.gzip.level",
        -1,
        ConfigType.INT,
        "gzip level when compression.type is gzip (-1: the codec's default)",
        check=_gzip_level,
    )
    compression_lz4_level: int = config_field(
        "compression.lz4.level",
        9,
        ConfigType.INT,
        "lz4 level when compression.type is lz4",
        minimum=1,
        maximum=17,
    )
    compression_zstd_level: int = config_field(
        "compression.zstd.level",
        3,
        ConfigType.INT,
        "zstd level when compression.type is zstd",
        minimum=-131072,
        maximum=22,
    )
    min_insync_replicas: int = _int(
        "min.insync.replicas",
        1,
        1,
        "in-sync replicas acks=all needs, at most the partition's replicas (here its one, so "
        "any value is met, as Kafka 3.7+ caps it)",
    )
    unclean_leader_election_enable: bool = config_field(
        "unclean.leader.election.enable",
        False,
        ConfigType.BOOLEAN,
        "accepted: a partition has one replica, its data in object storage",
    )
    flush_messages: int = _long(
        "flush.messages", LONG_MAX, 1, "accepted: acks=all is fsynced in the WAL anyway"
    )
    flush_ms: int = _long("flush.ms", LONG_MAX, 0, "accepted: acks=all is fsynced in the WAL")
    file_delete_delay_ms: int = _long(
        "file.delete.delay.ms", 60_000, 0, "accepted: objects are deleted by the GC job"
    )
    preallocate: bool = config_field(
        "preallocate", False, ConfigType.BOOLEAN, "accepted: segments are streams, not files"
    )
    message_format_version: str = config_field(
        "message.format.version",
        "3.0-IV1",
        ConfigType.STRING,
        "deprecated, accepted: record batches are always v2",
        check=_format_version,
    )
    message_downconversion_enable: bool = config_field(
        "message.downconversion.enable",
        True,
        ConfigType.BOOLEAN,
        "deprecated, accepted: no Fetch version old enough to need it is served",
    )
    leader_replication_throttled_replicas: tuple[str, ...] = config_field(
        "leader.replication.throttled.replicas",
        (),
        ConfigType.LIST,
        "accepted: no replication to throttle",
        check=_throttled_replicas,
    )
    follower_replication_throttled_replicas: tuple[str, ...] = config_field(
        "follower.replication.throttled.replicas",
        (),
        ConfigType.LIST,
        "accepted: no replication to throttle",
        check=_throttled_replicas,
    )
    remote_storage_enable: bool = config_field(
        "remote.storage.enable",
        False,
        ConfigType.BOOLEAN,
        "Kafka's tiered storage: off (the whole log is in object storage already)",
    )
    local_retention_ms: int = _long(
        "local.retention.ms", -2, -2, "accepted: tiered storage's local part (-2: retention.ms)"
    )
    local_retention_bytes: int = _long(
        "local.retention.bytes",
        -2,
        -2,
        "accepted: tiered storage's local part (-2: retention.bytes)",
    )
    remote_log_copy_disable: bool = config_field(
        "remote.log.copy.disable", False, ConfigType.BOOLEAN, "accepted: tiered storage"
    )
    remote_log_delete_on_disable: bool = config_field(
        "remote.log.delete.on.disable", False, ConfigType.BOOLEAN, "accepted: tiered storage"
    )

    def __post_init__(self) -> None:
        # the rules across properties, as Kafka's LogConfig.validateValues(InBroker)
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ConfigError(
                f"min.compaction.lag.ms: conflict topic config setting min.compaction.lag.ms "
                f"({self.min_compaction_lag_ms}) > max.compaction.lag.ms "
                f"({self.max_compaction_lag_ms})"
            )
        if self.remote_storage_enable:
            raise ConfigError(
                "remote.storage.enable: Tiered Storage functionality is disabled in the broker. "
                "Topic cannot be configured with remote log storage."
            )

    @property
    def timestamp_before_max_ms(self) -> int:
        """The oldest timestamp accepted, from now: before.max.ms, else the deprecated
        difference.max.ms (Kafka 3.9's rule)."""
        if self.message_timestamp_before_max_ms != LONG_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """The newest timestamp accepted, from now: after.max.ms, else difference.max.ms."""
        if self.message_timestamp_after_max_ms != LONG_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def max_time_index_entries(self) -> int:
        """Entries a segment's time index holds before the segment must roll (Kafka's rule;
        at least one, where Kafka's smallest index would hold none)."""
        return max(1, self.segment_index_bytes // 12)

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
