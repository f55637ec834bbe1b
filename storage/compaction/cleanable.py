"""Which partitions key compaction cleans now, and what range (pure; Kafka's
``LogCleanerManager.grabFilthiestCompactedLog`` rules, per partition).

A partition of a topic whose ``cleanup.policy`` has ``compact`` is cleanable over its sealed
segments below its last stable offset (an open transaction's data is never cleaned): from its
first segment to the last sealed segment that ends at or below
``min(active segment base, last stable offset)``. Segments a previous cleaning wrote
(``.cleaned``) are its clean part, the others its dirty part; it is cleaned when the dirty
part is at least ``min.cleanable.dirty.ratio`` of the range's bytes. The whole range is
cleaned at once: its output replaces every segment of it with one ``.cleaned`` segment.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.retention import PartitionLog


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

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


def plan_cleaning(log: PartitionLog) -> CleanUnit | None:
    """The cleaning this partition needs now, None when it needs none."""
    policy = log.policy
    if not policy.compacts or len(log.segments) < 2:
        return None
    active = log.segments[-1]
    limit = active.base_offset
    if log.last_stable_offset >= 0:
        limit = min(limit, log.last_stable_offset)
    sealed = [s for s in log.segments[:-1] if s.next_offset <= limit]
    if not sealed or all(s.cleaned for s in sealed):
        return None
    total = sum(s.size for s in sealed)
    dirty = sum(s.size for s in sealed if not s.cleaned)
    if total <= 0 or dirty / total < policy.min_cleanable_dirty_ratio:
        return None
    return CleanUnit(
        log.topic,
        log.partition,
        sealed[0].base_offset,
        sealed[-1].next_offset,
        len(sealed),
        dirty,
        total,
        policy.delete_retention_ms,
    )
