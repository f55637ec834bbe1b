"""S3StreamConfig: the stream store's settings, read once from Kafka/AutoMQ property names.

Every other module takes its numbers from this object; none reads the environment itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.config_def import (
    ConfigError,
    ConfigKey,
    ConfigType,
    config_field,
    declared_keys,
    parse_declared,
)

__all__ = ["ConfigError", "S3StreamConfig"]

_BUCKET_ID = re.compile(r"^\d+@")
# the longest span a *.minutes property may give (about 1900 years): any more is a typo
_MAX_MINUTES = 1e9

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def _text(name: str, default: str, doc: str, choices: tuple[str, ...] = ()) -> Any:
    return config_field(name, default, ConfigType.STRING, doc, choices=choices)


def _count(name: str, default: int, doc: str) -> Any:
    """A size, count or time in ms: at least 1."""
    return config_field(name, default, ConfigType.LONG, doc, minimum=1)


def _minutes(name: str, default: float, doc: str, *, zero_allowed: bool = False) -> Any:
    """Minutes, fractions allowed; 0 means "at once" where ``zero_allowed``."""
    return config_field(
        name,
        default,
        ConfigType.DOUBLE,
        doc,
        minimum=0,
        maximum=_MAX_MINUTES,
        positive=not zero_allowed,
    )


@dataclass(slots=True, frozen=True)
class S3StreamConfig:
    node_id: int = config_field("node.id", 0, ConfigType.INT, "this broker's node id", minimum=0)
    cluster_id: str = _text("cluster.id", "automq-py", "cluster id; objects live under _kafka_<id>")
    data_url: str = _text(
        "s3.data.buckets",
        "file://./data/objects",
        "object store: file:///dir or s3://bucket?endpoint=..&region=..&pathStyle=true",
    )
    metadata_url: str = _text(
        "metadata.store.url", "sqlite:///./data/metadata.db", "stream/object metadata database"
    )
    wal_path: str = _text(
        "s3.wal.path",
        "./data/wal",
        "where the write-ahead log lives: a directory for the file WAL, or a bucket for the "
        "object WAL (no local disk), in s3.data.buckets' syntax with its id: "
        "0@s3://bucket?region=..&endpoint=.. or 0@file:///dir",
    )
    wal_capacity: int = _count(
        "s3.wal.capacity",
        2 * GiB,
        "bytes of the WAL ring (file WAL); for the object WAL, the most record bytes between "
        "the trim point and the last append (appends wait for uploads beyond it)",
    )
    wal_object_batch_interval_ms: int = config_field(
        "s3.wal.object.batch.interval.ms",
        5,
        ConfigType.LONG,
        "object WAL: longest an append waits for others to share its WAL object (one PUT); "
        "0: only the appends of the same event loop pass share one",
        minimum=0,
    )
    wal_object_batch_size: int = _count(
        "s3.wal.object.batch.size",
        4 * MiB,
        "object WAL: a WAL object is written as soon as its appends reach this many bytes",
    )
    wal_object_max_inflight_uploads: int = _count(
        "s3.wal.object.max.inflight.uploads",
        8,
        "object WAL: WAL objects being written at once (acknowledged in offset order)",
    )
    wal_init_zero: bool = config_field(
        "s3.wal.init.zero",
        True,
        ConfigType.BOOLEAN,
        "write zeros through a new WAL file (as PostgreSQL's wal_init_zero): appends then "
        "overwrite written blocks; into merely allocated ones, each durable write first "
        "waits for a file system journal commit (false: allocate only, a faster first start)",
    )
    wal_io_realtime: bool = config_field(
        "s3.wal.io.realtime",
        True,
        ConfigType.BOOLEAN,
        "run the kernel's io_uring workers that make the file WAL's durable writes at real-time "
        "priority (SCHED_FIFO 1) where the process may (CAP_SYS_NICE or RLIMIT_RTPRIO): their "
        "wake-ups after the disk's write and flush then wait for no core (false: normal "
        "priority)",
    )
    wal_cache_size: int = _count(
        "s3.wal.cache.size", 512 * MiB, "LogCache bytes; appends wait when unuploaded data fills it"
    )
    wal_upload_threshold: int = _count(
        "s3.wal.upload.threshold", 100 * MiB, "LogCache bytes that trigger an upload"
    )
    wal_upload_interval_ms: int = _count(
        "s3.wal.upload.interval.ms", 60_000, "longest time data waits in the LogCache"
    )
    stream_object_split_size: int = _count(
        "s3.stream.object.split.size", 8 * MiB, "a stream run this large becomes a Stream Object"
    )
    object_block_size: int = _count("s3.object.block.size", 512 * KiB, "data block size")
    object_part_size: int = _count("s3.object.part.size", 16 * MiB, "multipart upload part size")
    block_cache_size: int = _count(
        "s3.block.cache.size",
        256 * MiB,
        "bytes of data blocks read from object storage kept in memory (read-ahead included)",
    )
    cache_pretouch: bool = config_field(
        "s3.cache.pretouch",
        True,
        ConfigType.BOOLEAN,
        "fault in, at start, the memory s3.wal.cache.size and s3.block.cache.size fill (at most "
        "half the memory available), as the JVM's AlwaysPreTouch: the broker is resident at "
        "that size from the start and its first GBs take no page faults (false: memory is "
        "faulted in as the caches fill)",
    )
    readahead_size: int = _count(
        "s3.block.cache.readahead.size",
        32 * MiB,
        "most bytes one sequential cold reader reads ahead (it starts at 1 MiB and doubles; "
        "less when the active readers' read-ahead would not fit in s3.block.cache.size)",
    )
    object_prepare_ttl_ms: int = _count(
        "s3.object.prepare.ttl.ms", 3_600_000, "a PREPARED object not committed by then expires"
    )
    max_concurrent_requests: int = _count(
        "s3.max.concurrent.requests", 32, "object storage requests in flight"
    )
    request_retry_timeout_ms: int = _count(
        "s3.request.retry.timeout.ms", 120_000, "how long a failing request is retried"
    )

    sso_compaction_interval_minutes: float = _minutes(
        "s3.stream.set.object.compaction.interval.minutes",
        20.0,
        "how often the broker compacts its Stream Set Objects",
    )
    sso_compaction_cache_size: int = _count(
        "s3.stream.set.object.compaction.cache.size",
        200 * MiB,
        "bytes of data one SSO compaction iteration reads into memory",
    )
    sso_compaction_split_size: int = _count(
        "s3.stream.set.object.compaction.stream.split.size",
        8 * MiB,
        "a stream run this large leaves the compacted SSO as a Stream Object",
    )
    sso_compaction_force_split_minutes: float = _minutes(
        "s3.stream.set.object.compaction.force.split.minutes",
        120.0,
        "SSOs older than this are split into Stream Objects",
    )
    sso_compaction_max_num: int = _count(
        "s3.stream.set.object.compaction.max.num",
        500,
        "most SSOs one compaction run takes",
    )
    so_compaction_interval_minutes: float = _minutes(
        "s3.stream.object.compaction.interval.minutes",
        60.0,
        "how often the broker merges small Stream Objects",
    )
    so_compaction_max_size: int = _count(
        "s3.stream.object.compaction.max.size.bytes",
        GiB,
        "largest Stream Object that SO compaction makes",
    )
    object_delete_retention_minutes: float = _minutes(
        "s3.object.delete.retention.minutes",
        10.0,
        "how long a compacted or trimmed object stays readable before it is deleted",
        zero_allowed=True,
    )
    gc_orphan_min_age_minutes: float = _minutes(
        "s3.object.gc.orphan.min.age.minutes",
        60.0,
        "an object no metadata names is deleted only once it is this old",
        zero_allowed=True,
    )
    maintenance_runner: str = _text(
        "s3.maintenance.runner",
        "auto",
        "who runs compaction, retention and GC: auto (Spark if a JVM and pyspark are there, "
        "else in-process), spark, local (in-process) or none",
        choices=("auto", "spark", "local", "none"),
    )
    # the broker's log.format, for the upload worker's own log lines (not a property here)
    log_format: str = "text"

    @property
    def namespace(self) -> str:
        return f"_kafka_{self.cluster_id}"

    @classmethod
    def properties(cls) -> dict[str, tuple[str, ConfigKey]]:
        """Property name -> (attribute, key)."""
        return declared_keys(cls)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, strict: bool = False) -> S3StreamConfig:
        """Build from ``name -> string value``; unknown names are ignored unless ``strict``.

        Sizes accept plain integers. Raises ConfigError naming the property at fault.
        """
        config = cls(**parse_declared(cls, props, strict=strict))
        config.validate()
        return config

    def validate(self) -> None:
        """Cross-property checks, each naming the property to change."""
        if self.wal_upload_threshold > self.wal_cache_size:
            raise ConfigError(
                f"s3.wal.upload.threshold ({self.wal_upload_threshold}) must not exceed "
                f"s3.wal.cache.size ({self.wal_cache_size})"
            )
        if self.object_part_size < 5 * MiB:
            raise ConfigError(
                f"s3.object.part.size must be at least 5 MiB (S3's minimum), got "
                f"{self.object_part_size}"
            )
        if self.wal_upload_threshold > self.wal_capacity // 2:
            raise ConfigError(
                f"s3.wal.upload.threshold ({self.wal_upload_threshold}) must be at most half of "
                f"s3.wal.capacity ({self.wal_capacity}) so appends continue during an upload"
            )
        data = self.object_store_url
        if not (data.startswith("file://") or data.startswith("s3://")):
            raise ConfigError(
                f"s3.data.buckets must be file://DIR or s3://BUCKET?..., got {data!r}"
            )
        wal_url = self.wal_object_store_url
        if wal_url is not None and not (
            wal_url.startswith("file://") or wal_url.startswith("s3://")
        ):
            raise ConfigError(
                f"s3.wal.path must be a directory, 0@s3://BUCKET?... or 0@file:///DIR, got "
                f"{self.wal_path!r}"
            )
        if not self.cluster_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"cluster.id must be letters, digits, '-' or '_', got {self.cluster_id!r}"
            )

    @property
    def wal_object_store_url(self) -> str | None:
        """The object WAL's bucket url (``s3.wal.path`` without its ``<bucketId>@``), or None
        when ``s3.wal.path`` is a directory for the file WAL."""
        path = self.wal_path.strip()
        if _BUCKET_ID.match(path) or path.startswith("s3://"):
            return _BUCKET_ID.sub("", path, count=1)
        return None

    @property
    def object_store_url(self) -> str:
        """``s3.data.buckets`` without AutoMQ's ``<bucketId>@`` prefix."""
        return _BUCKET_ID.sub("", self.data_url, count=1)
