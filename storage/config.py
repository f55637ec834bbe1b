"""S3StreamConfig: the stream store's settings, read once from Kafka/AutoMQ property names.

Every other module takes its numbers from this object; none reads the environment itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

_BUCKET_ID = re.compile(r"^\d+@")
# properties for which 0 means "at once" (or, for node.id, the first node)
_ZERO_ALLOWED = (
    "node.id",
    "s3.object.delete.retention.minutes",
    "s3.object.gc.orphan.min.age.minutes",
)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


class ConfigError(ValueError):
    """A property is missing, malformed or out of range; the message names it."""


def _prop(name: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"property": name, "doc": doc})


@dataclass(slots=True, frozen=True)
class S3StreamConfig:
    node_id: int = _prop("node.id", 0, "this broker's node id")
    cluster_id: str = _prop("cluster.id", "automq-py", "cluster id; objects live under _kafka_<id>")
    data_url: str = _prop(
        "s3.data.buckets",
        "file://./data/objects",
        "object store: file:///dir or s3://bucket?endpoint=..&region=..&pathStyle=true",
    )
    metadata_url: str = _prop(
        "metadata.store.url", "sqlite:///./data/metadata.db", "stream/object metadata database"
    )
    wal_path: str = _prop("s3.wal.path", "./data/wal", "directory of the file write-ahead log")
    wal_capacity: int = _prop("s3.wal.capacity", 2 * GiB, "bytes of the WAL ring")
    wal_cache_size: int = _prop(
        "s3.wal.cache.size", 512 * MiB, "LogCache bytes; appends wait when unuploaded data fills it"
    )
    wal_upload_threshold: int = _prop(
        "s3.wal.upload.threshold", 100 * MiB, "LogCache bytes that trigger an upload"
    )
    wal_upload_interval_ms: int = _prop(
        "s3.wal.upload.interval.ms", 60_000, "longest time data waits in the LogCache"
    )
    stream_object_split_size: int = _prop(
        "s3.stream.object.split.size", 8 * MiB, "a stream run this large becomes a Stream Object"
    )
    object_block_size: int = _prop("s3.object.block.size", 512 * KiB, "data block size")
    object_part_size: int = _prop("s3.object.part.size", 16 * MiB, "multipart upload part size")
    block_cache_size: int = _prop("s3.block.cache.size", 128 * MiB, "cold-read block cache bytes")
    readahead_size: int = _prop(
        "s3.block.cache.readahead.size", 2 * MiB, "bytes read ahead for sequential cold reads"
    )
    object_prepare_ttl_ms: int = _prop(
        "s3.object.prepare.ttl.ms", 3_600_000, "a PREPARED object not committed by then expires"
    )
    max_concurrent_requests: int = _prop(
        "s3.max.concurrent.requests", 32, "object storage requests in flight"
    )
    request_retry_timeout_ms: int = _prop(
        "s3.request.retry.timeout.ms", 120_000, "how long a failing request is retried"
    )

    sso_compaction_interval_minutes: float = _prop(
        "s3.stream.set.object.compaction.interval.minutes",
        20.0,
        "how often the broker compacts its Stream Set Objects",
    )
    sso_compaction_cache_size: int = _prop(
        "s3.stream.set.object.compaction.cache.size",
        200 * MiB,
        "bytes of data one SSO compaction iteration reads into memory",
    )
    sso_compaction_split_size: int = _prop(
        "s3.stream.set.object.compaction.stream.split.size",
        8 * MiB,
        "a stream run this large leaves the compacted SSO as a Stream Object",
    )
    sso_compaction_force_split_minutes: float = _prop(
        "s3.stream.set.object.compaction.force.split.minutes",
        120.0,
        "SSOs older than this are split into Stream Objects",
    )
    sso_compaction_max_num: int = _prop(
        "s3.stream.set.object.compaction.max.num",
        500,
        "most SSOs one compaction run takes",
    )
    so_compaction_interval_minutes: float = _prop(
        "s3.stream.object.compaction.interval.minutes",
        60.0,
        "how often the broker merges small Stream Objects",
    )
    so_compaction_max_size: int = _prop(
        "s3.stream.object.compaction.max.size.bytes",
        GiB,
        "largest Stream Object that SO compaction makes",
    )
    object_delete_retention_minutes: float = _prop(
        "s3.object.delete.retention.minutes",
        10.0,
        "how long a compacted or trimmed object stays readable before it is deleted",
    )
    gc_orphan_min_age_minutes: float = _prop(
        "s3.object.gc.orphan.min.age.minutes",
        60.0,
        "an object no metadata names is deleted only once it is this old",
    )
    maintenance_runner: str = _prop(
        "s3.maintenance.runner",
        "auto",
        "who runs compaction, retention and GC: auto (Spark if a JVM and pyspark are there, "
        "else in-process), spark, local (in-process) or none",
    )

    @property
    def namespace(self) -> str:
        return f"_kafka_{self.cluster_id}"

    @classmethod
    def properties(cls) -> dict[str, tuple[str, Any, str]]:
        """Property name -> (attribute, default, description)."""
        return {
            f.metadata["property"]: (f.name, f.default, f.metadata["doc"])
            for f in fields(cls)
            if "property" in f.metadata
        }

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, strict: bool = False) -> S3StreamConfig:
        """Build from ``name -> string value``; unknown names are ignored unless ``strict``.

        Sizes accept plain integers. Raises ConfigError naming the property at fault.
        """
        known = cls.properties()
        values: dict[str, Any] = {}
        for name, raw in props.items():
            if name not in known:
                if strict:
                    raise ConfigError(f"unknown property {name!r}")
                continue
            attr, default, _ = known[name]
            value: Any
            if isinstance(default, float):  # minutes, fractions allowed
                try:
                    value = float(str(raw).strip())
                except ValueError:
                    raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
                if not 0 <= value <= 1e9 or (value == 0 and name not in _ZERO_ALLOWED):
                    raise ConfigError(f"{name}: must be positive, got {raw!r}")
            elif isinstance(default, int):
                try:
                    value = int(str(raw).strip())
                except ValueError:
                    raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
                if value < 0 or (value == 0 and name not in _ZERO_ALLOWED):
                    raise ConfigError(f"{name}: must be positive, got {value}")
            else:
                value = str(raw).strip()
                if not value:
                    raise ConfigError(f"{name}: must not be empty")
            values[attr] = value
        config = cls(**values)
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
        if self.maintenance_runner not in ("auto", "spark", "local", "none"):
            raise ConfigError(
                f"s3.maintenance.runner must be auto, spark, local or none, got "
                f"{self.maintenance_runner!r}"
            )
        data = self.object_store_url
        if not (data.startswith("file://") or data.startswith("s3://")):
            raise ConfigError(
                f"s3.data.buckets must be file://DIR or s3://BUCKET?..., got {data!r}"
            )
        if not self.cluster_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"cluster.id must be letters, digits, '-' or '_', got {self.cluster_id!r}"
            )

    @property
    def object_store_url(self) -> str:
        """``s3.data.buckets`` without AutoMQ's ``<bucketId>@`` prefix."""
        return _BUCKET_ID.sub("", self.data_url, count=1)
