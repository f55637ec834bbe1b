"""Stream Object compaction, retention and GC planning: pure functions, no I/O."""

from __future__ import annotations

from storage.compaction.gc import find_orphans, parse_object_key
from storage.compaction.stream_objects import plan_stream_object_compaction
from storage.metadata.image import MetadataImage
from storage.metadata.model import (
    ObjectState,
    S3Object,
    StreamMetadata,
    StreamObject,
    StreamState,
)
from storage.object_format import object_key
from storage.operator.base import ObjectInfo
from storage.retention import (
    PartitionLog,
    RetentionPolicy,
    SegmentInfo,
    plan_retention,
)

MiB = 1 << 20


def stream(*sos: tuple[int, int, int], start: int = 0) -> StreamMetadata:
    objects = tuple(StreamObject(i + 100, 1, a, b, size) for i, (a, b, size) in enumerate(sos))
    return StreamMetadata(1, 3, StreamState.OPENED, start, sos[-1][1], stream_objects=objects)


def test_so_groups_are_contiguous_and_bounded() -> None:
    s = stream((0, 10, 4), (10, 20, 4), (20, 30, 4), (40, 50, 1), (50, 60, 1), (60, 70, 9))
    groups = plan_stream_object_compaction([s], max_size=10)
    assert [[so.object_id for so in g.sources] for g in groups] == [[100, 101], [103, 104]]
    assert (groups[0].start_offset, groups[0].end_offset, groups[0].size) == (0, 20, 8)
    assert groups[0].stream_epoch == 3


def test_so_trimmed_and_large_objects_are_left_alone() -> None:
    s = stream((0, 10, 1), (10, 20, 1), (20, 30, 50), (30, 40, 1), start=10)
    assert plan_stream_object_compaction([s], max_size=50) == []


def seg(base: int, end: int, size: int, ts: int) -> SegmentInfo:
    return SegmentInfo(base, end, size, ts)


def partition(*segments: SegmentInfo, policy: RetentionPolicy, start: int = 0) -> PartitionLog:
    return PartitionLog("t", 0, policy, start, segments[-1].next_offset, segments)


def test_retention_ms_deletes_a_prefix_of_old_segments() -> None:
    log = partition(
        seg(0, 10, 100, 1_000),
        seg(10, 20, 100, 6_000),
        seg(20, 30, 100, 2_000),  # old, but behind a newer one: Kafka stops at the first kept
        seg(30, 35, 50, 9_000),
        policy=RetentionPolicy(retention_ms=4_000),
    )
    action = plan_retention(log, now_ms=9_500)
    assert action is not None
    assert (action.new_start_offset, action.segments, action.bytes) == (10, 1, 100)
    assert action.reason == "retention.ms"


def test_retention_takes_the_active_segment_too_but_never_an_empty_one() -> None:
    log = partition(
        seg(0, 10, 100, 1_000), seg(10, 12, 20, 1_000), policy=RetentionPolicy(retention_ms=10)
    )
    assert plan_retention(log, 5_000).new_start_offset == 12  # type: ignore[union-attr]
    empty_tail = partition(
        seg(0, 10, 100, 1_000), seg(10, 10, 0, -1), policy=RetentionPolicy(retention_ms=10)
    )
    assert plan_retention(empty_tail, 5_000).new_start_offset == 10  # type: ignore[union-attr]


def test_retention_bytes_keeps_at_least_the_limit() -> None:
    segments = [seg(i * 10, i * 10 + 10, 100, 10**12) for i in range(5)]
    log = partition(*segments, policy=RetentionPolicy(retention_ms=-1, retention_bytes=250))
    action = plan_retention(log, 10**12)
    assert action is not None
    # 500 bytes, limit 250: two segments go (300 left); a third would leave 200 < 250
    assert (action.new_start_offset, action.reason) == (20, "retention.bytes")


def test_retention_skips_compacted_topics_and_reached_starts() -> None:
    old = seg(0, 10, 100, 0)
    compact = RetentionPolicy(cleanup_policy=("compact",), retention_ms=1)
    assert plan_retention(partition(old, seg(10, 11, 1, 0), policy=compact), 10**9) is None
    done = partition(old, seg(10, 20, 1, 10**9), policy=RetentionPolicy(retention_ms=1), start=10)
    assert plan_retention(done, 10**9) is None
    both = RetentionPolicy(cleanup_policy=("compact", "delete"), retention_ms=1)
    assert plan_retention(partition(old, seg(10, 11, 1, 10**9), policy=both), 10**9) is not None


def test_orphans_are_old_unknown_keys_of_our_namespace_only() -> None:
    ns = "_kafka_c1"
    image = MetadataImage(
        objects={
            1: S3Object(1, ObjectState.COMMITTED, 10, 0, 0),
            2: S3Object(2, ObjectState.PREPARED, 0, 0, 10**9),
            3: S3Object(3, ObjectState.MARK_DESTROYED, 10, 0, 0),
        }
    )
    listing = [
        ObjectInfo(object_key(ns, 1), 10, 1_000),
        ObjectInfo(object_key(ns, 2), 10, 1_000),  # being uploaded: named as PREPARED
        ObjectInfo(object_key(ns, 3), 10, 1_000),  # marked: the grace period decides, not GC
        ObjectInfo(object_key(ns, 4), 10, 1_000),  # unknown and old: orphan
        ObjectInfo(object_key(ns, 5), 10, 99_000),  # unknown but young: maybe in flight
        ObjectInfo(object_key("_kafka_other", 6), 10, 1_000),  # another cluster's
        ObjectInfo("notes.txt", 10, 1_000),
    ]
    orphans = find_orphans(listing, image, ns, now_ms=100_000, min_age_ms=10_000)
    assert [(o.object_id, o.age_ms) for o in orphans] == [(4, 99_000)]
    assert parse_object_key(object_key(ns, 78), ns) == 78
    assert parse_object_key("00000000/_kafka_c1/78", ns) is None  # prefix does not match id
