"""Which partitions key compaction cleans, over which range (pure planner)."""

from __future__ import annotations

from storage.compaction.cleanable import (
    first_uncleanable_offset,
    max_compaction_delay,
    plan_cleaning,
)
from storage.retention import PartitionLog, RetentionPolicy, SegmentInfo

COMPACT = RetentionPolicy(cleanup_policy=("compact",), delete_retention_ms=1000)
NOW = 1_000_000
MINUTE = 60_000


def log(
    *segments: tuple[int, int, int, bool],
    policy: RetentionPolicy = COMPACT,
    lso: int = -1,
) -> PartitionLog:
    """Segments as (base, next, size, cleaned); the last one is the active segment."""
    infos = tuple(SegmentInfo(b, n, size, 0, cleaned) for b, n, size, cleaned in segments)
    return PartitionLog("t", 0, policy, infos[0].base_offset, infos[-1].next_offset, infos, lso)


def timed(
    *segments: tuple[int, int, int, int], policy: RetentionPolicy, cleaned: int = 0
) -> PartitionLog:
    """Segments as (base, next, first batch timestamp, largest timestamp), 100 bytes each,
    the first ``cleaned`` of them ``.cleaned``; the last one is the active segment."""
    infos = tuple(
        SegmentInfo(b, n, 100, largest, i < cleaned, first)
        for i, (b, n, first, largest) in enumerate(segments)
    )
    return PartitionLog("t", 0, policy, infos[0].base_offset, infos[-1].next_offset, infos)


def lags(min_ms: int = 0, max_ms: int = (1 << 63) - 1, ratio: float = 0.5) -> RetentionPolicy:
    return RetentionPolicy(
        cleanup_policy=("compact",),
        min_cleanable_dirty_ratio=ratio,
        min_compaction_lag_ms=min_ms,
        max_compaction_lag_ms=max_ms,
    )


def test_the_sealed_segments_are_cleaned_together() -> None:
    unit = plan_cleaning(log((0, 10, 100, False), (10, 20, 100, False), (20, 25, 50, False)), NOW)
    assert unit is not None
    assert (unit.base_offset, unit.end_offset, unit.segments) == (0, 20, 2)
    assert unit.dirty_ratio == 1.0 and unit.delete_retention_ms == 1000
    assert not unit.overdue


def test_a_delete_only_topic_or_a_lone_active_segment_is_not_cleaned() -> None:
    delete_only = log((0, 10, 100, False), (10, 20, 1, False), policy=RetentionPolicy())
    assert plan_cleaning(delete_only, NOW) is None
    assert plan_cleaning(log((0, 10, 100, False)), NOW) is None


def test_the_dirty_ratio_decides() -> None:
    segments = ((0, 10, 300, True), (10, 20, 100, False), (20, 21, 1, False))
    assert plan_cleaning(log(*segments), NOW) is None  # 100 / 400 < 0.5
    eager = RetentionPolicy(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.2)
    unit = plan_cleaning(log(*segments, policy=eager), NOW)
    assert unit is not None and (unit.base_offset, unit.end_offset) == (0, 20)
    # at the ratio exactly: not yet (Kafka cleans above it)
    exact = RetentionPolicy(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.25)
    assert plan_cleaning(log(*segments, policy=exact), NOW) is None
    # nothing dirty: nothing to do, whatever the ratio
    zero = RetentionPolicy(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0)
    assert plan_cleaning(log((0, 10, 300, True), (10, 11, 1, False), policy=zero), NOW) is None


def test_an_open_transaction_bounds_the_range() -> None:
    segments = ((0, 10, 100, False), (10, 20, 100, False), (20, 30, 100, False))
    unit = plan_cleaning(log(*segments, lso=15), NOW)
    assert unit is not None and unit.end_offset == 10
    assert plan_cleaning(log(*segments, lso=5), NOW) is None


# -- min.compaction.lag.ms ---------------------------------------------------------------------


def test_min_lag_stops_at_the_first_segment_with_a_record_newer_than_the_lag() -> None:
    old, recent = NOW - 10 * MINUTE, NOW - MINUTE
    # the second segment holds a record newer than now - 5 min: it and all after it wait
    segments = ((0, 10, old, old), (10, 20, old, recent), (20, 30, old, old), (30, 31, NOW, NOW))
    policy = lags(min_ms=5 * MINUTE)
    assert first_uncleanable_offset(timed(*segments, policy=policy), NOW) == 10
    unit = plan_cleaning(timed(*segments, policy=policy), NOW)
    assert unit is not None and (unit.base_offset, unit.end_offset, unit.segments) == (0, 10, 1)
    # a lag of 0 (Kafka's default) leaves every sealed segment cleanable
    unit = plan_cleaning(timed(*segments, policy=lags()), NOW)
    assert unit is not None and unit.end_offset == 30


def test_min_lag_is_measured_by_the_largest_timestamp_and_is_exclusive() -> None:
    lag = 5 * MINUTE
    at_horizon = ((0, 10, NOW - lag, NOW - lag), (10, 11, NOW, NOW))
    unit = plan_cleaning(timed(*at_horizon, policy=lags(min_ms=lag)), NOW)
    assert unit is not None and unit.end_offset == 10  # not newer than now - lag: cleanable
    newer = ((0, 10, NOW - lag - 1, NOW - lag + 1), (10, 11, NOW, NOW))
    assert plan_cleaning(timed(*newer, policy=lags(min_ms=lag)), NOW) is None


def test_min_lag_looks_at_dirty_segments_only() -> None:
    """A ``.cleaned`` segment may hold recent records: it does not hold the dirty ones back,
    as Kafka looks from the first dirty offset on."""
    old = NOW - 10 * MINUTE
    segments = ((0, 10, NOW, NOW), (10, 20, old, old), (20, 21, NOW, NOW))
    unit = plan_cleaning(timed(*segments, policy=lags(min_ms=MINUTE, ratio=0.0), cleaned=1), NOW)
    assert unit is not None and (unit.base_offset, unit.end_offset) == (0, 20)


def test_min_lag_and_the_last_stable_offset_both_bound_the_range() -> None:
    old, recent = NOW - 10 * MINUTE, NOW - MINUTE
    segments = ((0, 10, old, old), (10, 20, old, old), (20, 30, old, recent), (30, 31, NOW, NOW))
    with_lso = PartitionLog(
        "t", 0, lags(min_ms=5 * MINUTE), 0, 31, timed(*segments, policy=COMPACT).segments, 15
    )
    assert first_uncleanable_offset(with_lso, NOW) == 15
    unit = plan_cleaning(with_lso, NOW)
    assert unit is not None and unit.end_offset == 10


# -- max.compaction.lag.ms ---------------------------------------------------------------------


def test_max_lag_cleans_below_the_dirty_ratio() -> None:
    old = NOW - 10 * MINUTE
    # 100 dirty bytes of 300: below a 0.99 ratio
    segments = ((0, 10, old, old), (10, 20, old, old), (20, 30, old, old), (30, 31, NOW, NOW))
    policy = lags(max_ms=5 * MINUTE, ratio=0.99)
    overdue = timed(*segments, policy=policy, cleaned=2)
    assert max_compaction_delay(overdue, NOW) == 5 * MINUTE
    unit = plan_cleaning(overdue, NOW)
    assert unit is not None and unit.overdue
    assert (unit.base_offset, unit.end_offset, unit.dirty_bytes, unit.total_bytes) == (
        0,
        30,
        100,
        300,
    )
    # within the lag: the ratio decides, and it is not reached
    assert (
        plan_cleaning(timed(*segments, policy=lags(max_ms=20 * MINUTE, ratio=0.99), cleaned=2), NOW)
        is None
    )


def test_max_lag_uses_the_earliest_first_batch_timestamp_of_the_dirty_segments() -> None:
    lag = 5 * MINUTE
    recent = NOW - MINUTE
    # the cleaned segment is old but clean; the dirty one began within the lag
    fresh = (
        (0, 10, NOW - 60 * MINUTE, NOW - 60 * MINUTE),
        (10, 20, recent, recent),
        (20, 21, NOW, NOW),
    )
    policy = lags(max_ms=lag, ratio=0.99)
    assert max_compaction_delay(timed(*fresh, policy=policy, cleaned=1), NOW) == 0
    assert plan_cleaning(timed(*fresh, policy=policy, cleaned=1), NOW) is None
    # a segment whose first batch is unknown (0) does not count, as in Kafka
    unknown = ((0, 10, 0, recent), (10, 11, NOW, NOW))
    assert max_compaction_delay(timed(*unknown, policy=policy), NOW) == 0


def test_max_lag_never_cleans_past_the_min_lag_or_with_nothing_dirty() -> None:
    old, recent = NOW - 10 * MINUTE, NOW - MINUTE
    policy = lags(min_ms=5 * MINUTE, max_ms=MINUTE, ratio=0.99)
    # overdue (the first batch is 10 minutes old), but its newest record is within the min lag
    segments = ((0, 10, old, recent), (10, 11, NOW, NOW))
    assert max_compaction_delay(timed(*segments, policy=policy), NOW) > 0
    assert plan_cleaning(timed(*segments, policy=policy), NOW) is None
    # only cleaned segments below the active one: nothing to clean, overdue or not
    assert plan_cleaning(timed(*segments, policy=policy, cleaned=1), NOW) is None
