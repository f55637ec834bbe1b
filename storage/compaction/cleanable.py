"""Which partitions key compaction cleans now, and what range (pure; Kafka 3.9's
``LogCleanerManager.cleanableOffsets`` and ``grabFilthiestCompactedLog`` rules, per partition).

A partition of a topic whose ``cleanup.policy`` has ``compact`` is cleanable over its sealed
segments from its first segment up to its first uncleanable offset, the least of:

* the active segment's base offset (the active segment is never cleaned);
* the last stable offset (an open transaction's data is never cleaned);
* with ``min.compaction.lag.ms`` above 0, the base offset of the first dirty segment whose
  largest timestamp is newer than ``now - min.compaction.lag.ms`` (that segment and every
  one after it keep their records uncompacted for at least the lag).

Segments a previous cleaning wrote (``.cleaned``) are the range's clean part, the others its
dirty part. It is cleaned when the dirty part is at least ``min.cleanable.dirty.ratio`` of the
range's bytes, or, whatever the ratio, when it has dirty bytes and the earliest first-batch
timestamp of the log's sealed dirty segments is older than ``now - max.compaction.lag.ms``
(Kafka's ``needCompactionNow``). The whole range is cleaned at once: its output replaces
every segment of it with one ``.cleaned`` segment.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.retention import PartitionLog, SegmentInfo


@dataclass(slots=True, frozen=True)
class CleanUnit:
    """Clean ``topic``-``partition`` over ``[base_offset, end_offset)``."""

    topic: str
    partition: int
    base_offset: int
    end_offset: int
    segments: int
    dirty_bytes: int
    total_bytes: int
    delete_retention_ms: int
    overdue: bool = False  # max.compaction.lag.ms passed: cleaned whatever the dirty ratio

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


def plan_cleaning(log: PartitionLog, now_ms: int) -> CleanUnit | None:
    """The cleaning this partition needs at ``now_ms`` (the controller's clock), None when it
    needs none."""
    policy = log.policy
    if not policy.compacts or len(log.segments) < 2:
        return None
    limit = first_uncleanable_offset(log, now_ms)
    cleanable = [s for s in log.segments[:-1] if s.next_offset <= limit]
    dirty = sum(s.size for s in cleanable if not s.cleaned)
    total = sum(s.size for s in cleanable)
    if dirty <= 0:
        return None
    overdue = max_compaction_delay(log, now_ms) > 0
    # Kafka cleans a log whose dirty share is above the ratio, not at it
    if not overdue and dirty / total <= policy.min_cleanable_dirty_ratio:
        return None
    return CleanUnit(
        log.topic,
        log.partition,
        cleanable[0].base_offset,
        cleanable[-1].next_offset,
        len(cleanable),
        dirty,
        total,
        policy.delete_retention_ms,
        overdue,
    )


def first_uncleanable_offset(log: PartitionLog, now_ms: int) -> int:
    """Kafka's ``firstUncleanableDirtyOffset``: no segment ending above it is cleaned."""
    limit = log.segments[-1].base_offset
    if log.last_stable_offset >= 0:
        limit = min(limit, log.last_stable_offset)
    lag = max(log.policy.min_compaction_lag_ms, 0)
    if lag > 0:
        for s in _dirty_sealed(log):
            if s.max_timestamp > now_ms - lag:
                return min(limit, s.base_offset)
    return limit


def max_compaction_delay(log: PartitionLog, now_ms: int) -> int:
    """How long (ms) past ``max.compaction.lag.ms`` the log's oldest dirty record is: its
    earliest first-batch timestamp among the sealed dirty segments; 0 when not past (Kafka's
    ``maxCompactionDelay``; segments with no known timestamp do not count)."""
    firsts = [s.first_batch_timestamp for s in _dirty_sealed(log) if s.first_batch_timestamp > 0]
    if not firsts:
        return 0
    clean_until = now_ms - max(log.policy.max_compaction_lag_ms, 0)
    return max(clean_until - min(firsts), 0)


def _dirty_sealed(log: PartitionLog) -> list[SegmentInfo]:
    """The sealed segments no cleaning wrote, oldest first."""
    return [s for s in log.segments[:-1] if not s.cleaned]
