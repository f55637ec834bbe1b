"""Which partitions key compaction cleans, over which range (pure planner)."""

from __future__ import annotations

from storage.compaction.cleanable import plan_cleaning
from storage.retention import PartitionLog, RetentionPolicy, SegmentInfo

COMPACT = RetentionPolicy(cleanup_policy=("compact",), delete_retention_ms=1000)


def log(
    *segments: tuple[int, int, int, bool],
    policy: RetentionPolicy = COMPACT,
    lso: int = -1,
) -> PartitionLog:
    """Segments as (base, next, size, cleaned); the last one is the active segment."""
    infos = tuple(SegmentInfo(b, n, size, 0, cleaned) for b, n, size, cleaned in segments)
    return PartitionLog("t", 0, policy, infos[0].base_offset, infos[-1].next_offset, infos, lso)


def test_the_sealed_segments_are_cleaned_together() -> None:
    unit = plan_cleaning(log((0, 10, 100, False), (10, 20, 100, False), (20, 25, 50, False)))
    assert unit is not None
    assert (unit.base_offset, unit.end_offset, unit.segments) == (0, 20, 2)
    assert unit.dirty_ratio == 1.0 and unit.delete_retention_ms == 1000


def test_a_delete_only_topic_or_a_lone_active_segment_is_not_cleaned() -> None:
    delete_only = log((0, 10, 100, False), (10, 20, 1, False), policy=RetentionPolicy())
    assert plan_cleaning(delete_only) is None
    assert plan_cleaning(log((0, 10, 100, False))) is None


def test_the_dirty_ratio_decides() -> None:
    segments = ((0, 10, 300, True), (10, 20, 100, False), (20, 21, 1, False))
    assert plan_cleaning(log(*segments)) is None  # 100 / 400 < 0.5
    eager = RetentionPolicy(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.2)
    unit = plan_cleaning(log(*segments, policy=eager))
    assert unit is not None and (unit.base_offset, unit.end_offset) == (0, 20)
    # nothing dirty: nothing to do, whatever the ratio
    zero = RetentionPolicy(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0)
    assert plan_cleaning(log((0, 10, 300, True), (10, 11, 1, False), policy=zero)) is None


def test_an_open_transaction_bounds_the_range() -> None:
    segments = ((0, 10, 100, False), (10, 20, 100, False), (20, 30, 100, False))
    unit = plan_cleaning(log(*segments, lso=15))
    assert unit is not None and unit.end_offset == 10
    assert plan_cleaning(log(*segments, lso=5)) is None
