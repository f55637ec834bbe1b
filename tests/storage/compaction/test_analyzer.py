"""The SSO compaction planner on seed 002's worked example, and its invariants (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage.compaction.analyzer import (
    SO,
    SSO,
    CompactionPlan,
    SourceObject,
    plan_compaction,
    select_sources,
)
from storage.object_format import DataBlockIndex


def sso(object_id: int, *blocks: tuple[int, int, int], order_id: int = 0) -> SourceObject:
    """An SSO whose data blocks are (stream, start, end), each ``end - start`` bytes long, laid
    out one after the other (the seed's colour blocks: length stands for size)."""
    index = []
    position = 0
    for stream, start, end in blocks:
        index.append(DataBlockIndex(stream, start, end - start, 1, position, end - start))
        position += end - start
    return SourceObject(object_id, position + 48, order_id or object_id, 0, tuple(index))


def described(plan: CompactionPlan) -> list[dict[str, list[tuple[object, ...]]]]:
    """Each iteration as the seed tells it: the batch reads per object, the objects written."""
    return [
        {
            "reads": [
                (
                    r.object_id,
                    *[
                        (b.block.stream_id, b.block.start_offset, b.block.end_offset)
                        for b in r.blocks
                    ],
                )
                for r in it.reads
            ],
            "writes": [
                (
                    o.kind,
                    *[
                        (b.block.stream_id, b.block.start_offset, b.block.end_offset)
                        for b in o.blocks
                    ],
                )
                for o in it.outputs
            ],
        }
        for it in plan.iterations
    ]


def test_seed_002_worked_example() -> None:
    """Three SSOs, memory limit 150: two iterations, exactly the reads and objects of seed 002.

    SSO-0 holds S0 0-20, S1 30-60, S3 210-230; SSO-1 S0 20-25, S1 60-120; SSO-2 S2 400-435,
    S2 435-500, S3 230-270. S1 (90) and S2 (100) pass the split size and become Stream Objects;
    S0 (25) and S3 (60) go to the new SSO-3. S2 is cut by the memory limit into two SOs.
    """
    sources = [
        sso(0, (0, 0, 20), (1, 30, 60), (3, 210, 230)),
        sso(1, (0, 20, 25), (1, 60, 120)),
        sso(2, (2, 400, 435), (2, 435, 500), (3, 230, 270)),
    ]
    starts = {0: 0, 1: 30, 2: 400, 3: 210}

    plan = plan_compaction(sources, starts, split_size=70, cache_size=150)

    assert plan is not None
    assert described(plan) == [
        {
            "reads": [
                (0, (0, 0, 20), (1, 30, 60)),  # SSO-0: S0 (0-20) and S1 (30-60) in one read
                (1, (0, 20, 25), (1, 60, 120)),  # SSO-1: S0 (20-25) and S1 (60-120)
                (2, (2, 400, 435)),  # SSO-2: S2 (400-435)
            ],
            "writes": [
                (SSO, (0, 0, 20), (0, 20, 25)),  # first part of SSO-3
                (SO, (1, 30, 60), (1, 60, 120)),  # SO-0
                (SO, (2, 400, 435)),  # SO-1
            ],
        },
        {
            "reads": [
                (0, (3, 210, 230)),  # SSO-0: S3 (210-230)
                (2, (2, 435, 500), (3, 230, 270)),  # SSO-2: S2 (435-500) and S3 (230-270)
            ],
            "writes": [
                (SO, (2, 435, 500)),  # SO-2
                (SSO, (3, 210, 230), (3, 230, 270)),  # last part of SSO-3
            ],
        },
    ]
    assert [it.size for it in plan.iterations] == [150, 125]
    assert plan.compacted_object_ids == (0, 1, 2)
    assert (plan.stream_object_count, plan.has_stream_set_object, plan.object_count) == (3, True, 4)
    assert (plan.block_count, plan.get_count) == (8, 5)  # adjacent blocks merged: 8 -> 5 GETs


def test_trimmed_and_deleted_streams_are_dropped() -> None:
    sources = [sso(0, (0, 0, 10), (0, 10, 20), (1, 0, 10)), sso(1, (0, 20, 30), (5, 0, 10))]
    # stream 0 starts at 15: block 0-10 goes, 10-20 is read and cut at 15 (about half of it
    # goes); stream 5 was deleted
    plan = plan_compaction(sources, {0: 15, 1: 0}, split_size=1000, cache_size=1000)
    assert plan is not None
    assert plan.dropped_bytes == 10 + 5 + 10
    assert plan.start_offsets == {0: 15}
    assert described(plan)[0]["writes"] == [(SSO, (0, 10, 20), (0, 20, 30), (1, 0, 10))]


def test_a_lone_source_is_rewritten_only_for_a_tenth_of_its_bytes() -> None:
    """A compacted SSO whose streams' starts moved into its blocks: rewritten once the cut
    data reaches a tenth of it, not at every retention step."""
    lone = [sso(0, (0, 0, 100), (1, 0, 100))]  # 248 bytes, 1 byte per offset
    assert plan_compaction(lone, {0: 24, 1: 0}, split_size=1000, cache_size=1000) is None
    plan = plan_compaction(lone, {0: 25, 1: 0}, split_size=1000, cache_size=1000)
    assert plan is not None and plan.start_offsets == {0: 25} and plan.dropped_bytes == 25


def test_gaps_cut_runs() -> None:
    """Offsets held elsewhere (a Stream Object) between two ranges: two runs, never one SO
    claiming offsets it does not hold."""
    sources = [sso(0, (0, 0, 50)), sso(1, (0, 80, 130))]
    plan = plan_compaction(sources, {0: 0}, split_size=40, cache_size=1000)
    assert plan is not None
    assert described(plan)[0]["writes"] == [(SO, (0, 0, 50)), (SO, (0, 80, 130))]


def test_force_split_makes_stream_objects_of_old_sources() -> None:
    old = SourceObject(7, 100, 1, 1_000, sso(7, (0, 0, 5), (1, 0, 5)).index)
    new = SourceObject(8, 100, 2, 9_000, sso(8, (0, 5, 9)).index)
    plan = plan_compaction(
        [old, new], {0: 0, 1: 0}, split_size=100, cache_size=100, force_split_before_ms=5_000
    )
    assert plan is not None
    assert described(plan)[0]["writes"] == [(SO, (0, 0, 5)), (SSO, (0, 5, 9)), (SO, (1, 0, 5))]


def test_nothing_to_gain() -> None:
    assert plan_compaction([sso(0, (0, 0, 10))], {0: 0}, split_size=100, cache_size=100) is None
    assert plan_compaction([], {}, split_size=100, cache_size=100) is None


def test_oversized_block_gets_its_own_iteration() -> None:
    sources = [sso(0, (0, 0, 10), (1, 0, 500)), sso(1, (2, 0, 10))]
    plan = plan_compaction(sources, {0: 0, 1: 0, 2: 0}, split_size=1000, cache_size=100)
    assert plan is not None
    assert [it.size for it in plan.iterations] == [10, 500, 10]


def test_select_sources_takes_the_oldest() -> None:
    objects = [sso(i, (0, i, i + 1), order_id=10 - i) for i in range(5)]
    now, later = select_sources(objects, 2)
    assert [o.object_id for o in now] == [4, 3]
    assert len(later) == 3


blocks = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40)), min_size=1, max_size=12)


@given(
    layout=st.lists(blocks, min_size=1, max_size=5),
    split=st.integers(1, 200),
    cache=st.integers(1, 200),
    trim=st.dictionaries(st.integers(0, 4), st.integers(0, 100)),
)
def test_every_live_block_is_written_once_in_order(
    layout: list[list[tuple[int, int]]], split: int, cache: int, trim: dict[int, int]
) -> None:
    # give each stream contiguous offsets across the objects, in object order
    next_offset: dict[int, int] = {}
    sources = []
    for object_id, object_blocks in enumerate(layout):
        laid = []
        for stream, size in sorted(object_blocks):
            start = next_offset.get(stream, 0)
            next_offset[stream] = start + size
            laid.append((stream, start, start + size))
        sources.append(sso(object_id, *laid))
    starts = {s: trim.get(s, 0) for s in range(4)}  # stream 4 is deleted
    plan = plan_compaction(sources, starts, split_size=split, cache_size=cache)
    live = sorted(
        (b.stream_id, b.start_offset)
        for s in sources
        for b in s.index
        if b.stream_id in starts and b.end_offset > starts[b.stream_id]
    )
    if plan is None:
        assert len(sources) == 1
        return
    written = [
        (b.block.stream_id, b.block.start_offset)
        for it in plan.iterations
        for o in it.outputs
        for b in o.blocks
    ]
    assert sorted(written) == live
    sso_blocks = [
        (b.block.stream_id, b.block.start_offset)
        for it in plan.iterations
        for o in it.outputs
        if o.kind == SSO
        for b in o.blocks
    ]
    assert sso_blocks == sorted(sso_blocks)  # the new SSO is written in (stream, offset) order
    for it in plan.iterations:
        read = sorted((b.object_id, b.block.start_position) for r in it.reads for b in r.blocks)
        out = sorted((b.object_id, b.block.start_position) for o in it.outputs for b in o.blocks)
        assert read == out
        assert it.size <= cache or len(out) == 1
        for o in it.outputs:
            if o.kind == SO:  # a Stream Object holds one contiguous run of one stream
                assert all(
                    a.block.stream_id == b.block.stream_id
                    and a.block.end_offset == b.block.start_offset
                    for a, b in zip(o.blocks, o.blocks[1:], strict=False)
                )
