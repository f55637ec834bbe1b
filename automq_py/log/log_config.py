"""LogConfig: a partition log's settings, read once from Kafka topic property names.

Built from ``name -> value`` (a topic's configs layered over the broker defaults) by
:meth:`LogConfig.from_properties`; every error names the property at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

INT64_MAX = (1 << 63) - 1
DAY_MS = 24 * 3600 * 1000

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("delete", "compact")
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


class LogConfigError(ValueError):
    """A topic property is malformed or out of range; the message names it."""


def _prop(name: str, default: Any, minimum: int | None, doc: str) -> Any:
    return field(default=default, metadata={"property": name, "min": minimum, "doc": doc})


@dataclass(slots=True, frozen=True)
class LogConfig:
    segment_bytes: int = _prop("segment.bytes", 1 << 30, 14, "roll a segment at this size")
    segment_ms: int = _prop("segment.ms", 7 * DAY_MS, 1, "roll a segment after this long")
    segment_jitter_ms: int = _prop("segment.jitter.ms", 0, 0, "random jitter off segment.ms")
    segment_index_bytes: int = _prop(
        "segment.index.bytes", 10 << 20, 12, "time index bytes per segment; full -> roll"
    )
    index_interval_bytes: int = _prop(
        "index.interval.bytes", 4096, 0, "log bytes between two time index entries"
    )
    retention_ms: int = _prop("retention.ms", 7 * DAY_MS, -1, "keep data this long (-1: ever)")
    retention_bytes: int = _prop(
        "retention.bytes", -1, -1, "keep at most this many bytes (-1: no limit)"
    )
    max_message_bytes: int = _prop("max.message.bytes", 1048588, 0, "largest record batch accepted")
    message_timestamp_type: str = _prop(
        "message.timestamp.type", "CreateTime", None, "CreateTime or LogAppendTime"
    )
    message_timestamp_before_max_ms: int = _prop(
        "message.timestamp.before.max.ms", INT64_MAX, 0, "oldest timestamp accepted, from now"
    )
    message_timestamp_after_max_ms: int = _prop(
        "message.timestamp.after.max.ms", INT64_MAX, 0, "newest timestamp accepted, from now"
    )
    cleanup_policy: tuple[str, ...] = _prop(
        "cleanup.policy", ("delete",), None, "comma-separated: delete, compact"
    )
    compression_type: str = _prop(
        "compression.type", "producer", None, "codec the log stores (producer: as sent)"
    )

    @property
    def max_time_index_entries(self) -> int:
        """Entries a segment's time index holds before the segment must roll (Kafka's rule)."""
        return self.segment_index_bytes // 12

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @classmethod
    def properties(cls) -> dict[str, tuple[str, Any, str]]:
        """Property name -> (attribute, default, description)."""
        return {
            f.metadata["property"]: (f.name, f.default, f.metadata["doc"])
            for f in fields(cls)
            if "property" in f.metadata
        }

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], *, strict: bool = False) -> LogConfig:
        """Build from ``name -> value`` (strings or Python values); unknown names are ignored
        unless ``strict``. Raises :class:`LogConfigError` naming the property at fault."""
        by_name = {f.metadata["property"]: f for f in fields(cls) if "property" in f.metadata}
        values: dict[str, Any] = {}
        for name, raw in props.items():
            f = by_name.get(name)
            if f is None:
                if strict:
                    raise LogConfigError(f"unknown topic property {name!r}")
                continue
            values[f.name] = _parse(name, raw, f.default, f.metadata["min"])
        return cls(**values)


def _parse(name: str, raw: Any, default: Any, minimum: int | None) -> Any:
    if isinstance(default, int):
        if isinstance(raw, bool):
            raise LogConfigError(f"{name}: expected an integer, got {raw!r}")
        try:
            value = int(raw) if isinstance(raw, int) else int(str(raw).strip())
        except ValueError:
            raise LogConfigError(f"{name}: expected an integer, got {raw!r}") from None
        if minimum is not None and value < minimum:
            raise LogConfigError(f"{name}: must be at least {minimum}, got {value}")
        if value > INT64_MAX:
            raise LogConfigError(f"{name}: must fit in a 64-bit long, got {value}")
        return value
    if isinstance(default, tuple):  # cleanup.policy, a list
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
        policy = tuple(str(p).strip().lower() for p in items if str(p).strip())
        bad = [p for p in policy if p not in CLEANUP_POLICIES]
        if not policy or bad:
            raise LogConfigError(
                f"{name}: expected a comma-separated list of {', '.join(CLEANUP_POLICIES)}, "
                f"got {raw!r}"
            )
        return policy
    text = str(raw).strip()
    allowed = {
        "message.timestamp.type": TIMESTAMP_TYPES,
        "compression.type": COMPRESSION_TYPES,
    }.get(name)
    if allowed is not None and text not in allowed:
        raise LogConfigError(f"{name}: expected one of {', '.join(allowed)}, got {raw!r}")
    return text
