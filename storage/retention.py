"""Retention planning (pure): which whole segments of a partition's log Kafka's rules delete.

The partition's owner reports its segments; this module decides the new log start offset, as
Kafka's ``UnifiedLog.deleteOldSegments`` does, and the owner applies it (DeleteRecords:
segments below leave ElasticLogMeta, the streams are trimmed). Three rules, each over a prefix
of the segments, oldest first, stopping at the first segment it keeps:

* ``retention.ms``: a segment goes once its largest timestamp is older than ``now -
  retention.ms``;
* ``retention.bytes``: segments go while the log stays at or above ``retention.bytes`` without
  them (``size - retention.bytes - segment.size >= 0``);
* the active (last) segment goes too when it is not empty, as in Kafka (which rolls first).

Topics whose ``cleanup.policy`` lacks ``delete`` keep everything (key compaction, not
retention, bounds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage.config_def import LONG_MAX

NO_LIMIT = -1


@dataclass(slots=True, frozen=True)
class SegmentInfo:
    """One segment of a partition's log: offsets ``[base_offset, next_offset)``."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int  # -1 when the segment holds no timestamped batch
    cleaned: bool = False  # a ``.cleaned`` segment: key compaction's output
    first_batch_timestamp: int = 0  # its first batch's max timestamp (0 or less: unknown)


@dataclass(slots=True, frozen=True)
class RetentionPolicy:
    """A topic's effective retention settings (its configs over the broker defaults)."""

    cleanup_policy: tuple[str, ...] = ("delete",)
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = NO_LIMIT
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy


@dataclass(slots=True, frozen=True)
class PartitionLog:
    """What the owner reports of one partition: its policy, bounds and segments in order."""

    topic: str
    partition: int
    policy: RetentionPolicy
    log_start_offset: int
    log_end_offset: int
    segments: tuple[SegmentInfo, ...]
    last_stable_offset: int = -1  # -1: not reported

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


@dataclass(slots=True, frozen=True)
class RetentionAction:
    """Move ``topic``-``partition``'s log start offset up to ``new_start_offset``."""

    topic: str
    partition: int
    new_start_offset: int
    segments: int  # whole segments that leave the log
    bytes: int
    reason: str  # "retention.ms", "retention.bytes"


def plan_retention(log: PartitionLog, now_ms: int) -> RetentionAction | None:
    """The start offset Kafka's rules give ``log`` at ``now_ms``, or None if nothing goes."""
    if not log.policy.deletes or not log.segments:
        return None
    live = [s for s in log.segments if s.next_offset > log.log_start_offset]
    by_time = _breached_by_time(live, log.policy.retention_ms, now_ms)
    by_size = _breached_by_size(live, log.policy.retention_bytes)
    count, reason = max((by_time, "retention.ms"), (by_size, "retention.bytes"))
    if count == 0:
        return None
    gone = live[:count]
    new_start = gone[-1].next_offset
    if new_start <= log.log_start_offset:
        return None
    return RetentionAction(
        log.topic,
        log.partition,
        min(new_start, log.log_end_offset),
        count,
        sum(s.size for s in gone),
        reason,
    )


def _deletable(segments: Sequence[SegmentInfo], i: int) -> bool:
    """Kafka never deletes an empty last segment (there would be nothing to roll)."""
    last = i == len(segments) - 1
    return not (last and segments[i].next_offset == segments[i].base_offset)


def _breached_by_time(segments: Sequence[SegmentInfo], retention_ms: int, now_ms: int) -> int:
    if retention_ms < 0:
        return 0
    count = 0
    for i, s in enumerate(segments):
        if not _deletable(segments, i) or now_ms - s.max_timestamp <= retention_ms:
            break
        count += 1
    return count


def _breached_by_size(segments: Sequence[SegmentInfo], retention_bytes: int) -> int:
    if retention_bytes < 0:
        return 0
    diff = sum(s.size for s in segments) - retention_bytes
    count = 0
    for i, s in enumerate(segments):
        if not _deletable(segments, i) or diff - s.size < 0:
            break
        diff -= s.size
        count += 1
    return count
