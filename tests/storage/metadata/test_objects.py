"""Objects: prepare/expire/destroy, upload commits, compaction commits, Stream Object compaction."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    ObjectState,
    RangeMetadata,
    S3Object,
    StreamObject,
    StreamSetObject,
)
from storage.object_format import StreamOffsetRange
from tests.storage.metadata.helpers import (
    TTL_MS,
    FakeClock,
    assert_refused,
    open_new_stream,
    write_so,
    write_sso,
)

# -- prepare / expire / destroy --------------------------------------------------------------------


async def test_prepare_reserves_consecutive_ids(manager: MetadataManager, clock: FakeClock) -> None:
    assert await manager.prepare_object(3, 500) == 0
    assert await manager.prepare_object(1, 500) == 3
    assert manager.image.objects[2] == S3Object(
        2, ObjectState.PREPARED, 0, clock.now, clock.now + 500
    )
    with pytest.raises(ValueError):
        await manager.prepare_object(0, 500)
    with pytest.raises(ValueError):
        await manager.prepare_object(1, -1)


async def test_concurrent_changes_run_one_at_a_time(manager: MetadataManager) -> None:
    firsts = await asyncio.gather(*(manager.prepare_object(3, TTL_MS) for _ in range(20)))
    ids = [i for first in firsts for i in range(first, first + 3)]
    assert sorted(ids) == list(range(60))


async def test_expire_prepared_marks_only_overdue_prepared_objects(
    manager: MetadataManager, clock: FakeClock
) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    committed = await write_sso(manager, 1, e, [(sid, 0, 0, 10)])
    short = await manager.prepare_object(2, 100)
    long = await manager.prepare_object(1, 10_000)

    assert await manager.expire_prepared() == []
    assert await manager.expire_prepared(clock.now + 100) == [short, short + 1]

    marked = manager.image.objects[short]
    assert (marked.state, marked.mark_destroyed_ms) == (ObjectState.MARK_DESTROYED, clock.now + 100)
    assert manager.image.objects[long].state is ObjectState.PREPARED
    assert manager.image.objects[committed].state is ObjectState.COMMITTED
    # an upload that finishes after its objects expired cannot commit them
    await assert_refused(
        manager,
        ErrorCode.OBJECT_NOT_EXIST,
        manager.commit_stream_set_object(1, e, short, short, 10, [CommitRange(sid, 0, 10, 20)], []),
    )


async def test_commit_after_the_deadline_is_refused_even_before_expiry_runs(
    manager: MetadataManager, clock: FakeClock
) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    oid = await manager.prepare_object(1, 100)
    clock.now += 100
    await assert_refused(
        manager,
        ErrorCode.OBJECT_NOT_EXIST,
        manager.commit_stream_set_object(1, e, oid, oid, 10, [CommitRange(sid, 0, 0, 10)], []),
    )


async def test_objects_to_delete_and_mark_destroyed_done(
    manager: MetadataManager, clock: FakeClock
) -> None:
    first = await manager.prepare_object(2, 0)
    await manager.expire_prepared(clock.now)  # marked at now
    assert manager.objects_to_delete(clock.now - 1) == []
    # marked at now: due at now (a zero retention deletes in the same millisecond)
    assert [o.object_id for o in manager.objects_to_delete(clock.now)] == [first, first + 1]

    await manager.mark_destroyed_done([first])
    assert first not in manager.image.objects  # forgotten: metadata shrinks as objects go
    assert [o.object_id for o in manager.objects_to_delete(clock.now + 1)] == [first + 1]
    await manager.mark_destroyed_done([first, first])  # already done: fine

    await assert_refused(manager, ErrorCode.OBJECT_NOT_EXIST, manager.mark_destroyed_done([77]))
    live = await manager.prepare_object(1, TTL_MS)
    await assert_refused(manager, ErrorCode.STREAM_INNER_ERROR, manager.mark_destroyed_done([live]))


# -- upload commits --------------------------------------------------------------------------------


async def test_upload_commit_advances_streams_and_records_objects(
    manager: MetadataManager, clock: FakeClock
) -> None:
    e = await manager.register_node(1)
    a = await open_new_stream(manager, 1, e)
    b = await open_new_stream(manager, 1, e)
    first = await manager.prepare_object(3, TTL_MS)
    sso, so1, so2 = first, first + 1, first + 2
    clock.now += 7

    await manager.commit_stream_set_object(
        1,
        e,
        sso,
        sso,
        1000,
        [CommitRange(b, 0, 0, 5), CommitRange(a, 0, 0, 10)],
        [
            CommitStreamObject(so2, a, 20, 30, 300),
            CommitStreamObject(so1, a, 10, 20, 200),
        ],
    )

    sa, sb = manager.stream(a), manager.stream(b)
    assert sa is not None and sb is not None
    assert (sa.end_offset, sa.ranges[-1].end_offset) == (30, 30)
    assert (sb.end_offset, sb.ranges[-1].end_offset) == (5, 5)
    assert sa.stream_objects == (
        StreamObject(so1, a, 10, 20, 200),
        StreamObject(so2, a, 20, 30, 300),
    )
    assert manager.image.nodes[1].stream_set_objects == (
        StreamSetObject(
            sso, 1, sso, clock.now, 1000, (StreamOffsetRange(a, 0, 10), StreamOffsetRange(b, 0, 5))
        ),
    )
    for oid, size in ((sso, 1000), (so1, 200), (so2, 300)):
        obj = manager.image.objects[oid]
        assert (obj.state, obj.object_size, obj.committed_ms) == (
            ObjectState.COMMITTED,
            size,
            clock.now,
        )


async def test_stream_objects_only_commit(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    so = await write_so(manager, 1, e, sid, 0, 10)
    s = manager.stream(sid)
    assert s is not None and s.end_offset == 10
    assert [x.object_id for x in s.stream_objects] == [so]
    assert manager.image.nodes[1].stream_set_objects == ()


async def test_recommit_of_the_same_objects_is_a_safe_retry(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    first = await manager.prepare_object(2, TTL_MS)
    args = (
        1,
        e,
        first,
        first,
        100,
        [CommitRange(sid, 0, 0, 10)],
        [CommitStreamObject(first + 1, sid, 10, 20, 50)],
    )
    await manager.commit_stream_set_object(*args)
    after = manager.stream(sid)
    await manager.commit_stream_set_object(*args)
    assert manager.stream(sid) == after


async def test_recommit_with_other_content_is_redundant(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    oid = await write_sso(manager, 1, e, [(sid, 0, 0, 10)], size=100)
    await assert_refused(
        manager,
        ErrorCode.REDUNDANT_OPERATION,
        manager.commit_stream_set_object(1, e, oid, oid, 999, [CommitRange(sid, 0, 0, 10)], []),
    )
    fresh = await manager.prepare_object(1, TTL_MS)
    await assert_refused(
        manager,
        ErrorCode.REDUNDANT_OPERATION,
        manager.commit_stream_set_object(
            1,
            e,
            oid,
            oid,
            100,
            [CommitRange(sid, 0, 0, 10)],
            [CommitStreamObject(fresh, sid, 10, 20, 5)],
        ),
    )


async def test_upload_commit_refusals(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1, epoch=2)
    await write_sso(manager, 1, e1, [(sid, 2, 0, 10)])
    oid = await manager.prepare_object(1, TTL_MS)

    def commit(
        node: int, epoch: int, *ranges: CommitRange, object_id: int = oid
    ) -> Awaitable[None]:
        return manager.commit_stream_set_object(node, epoch, object_id, object_id, 10, ranges, [])

    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_NOT_EXIST, commit(3, 1, CommitRange(sid, 2, 10, 20))
    )
    await manager.register_node(1)  # node 1 restarts: e1 is stale
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_EXPIRED, commit(1, e1, CommitRange(sid, 2, 10, 20))
    )
    e1 += 1
    await assert_refused(
        manager,
        ErrorCode.OBJECT_NOT_EXIST,
        commit(1, e1, CommitRange(sid, 2, 10, 20), object_id=oid + 100),
    )
    await assert_refused(
        manager, ErrorCode.STREAM_NOT_EXIST, commit(1, e1, CommitRange(sid + 1, 2, 0, 10))
    )
    await assert_refused(
        manager, ErrorCode.STREAM_FENCED, commit(1, e1, CommitRange(sid, 1, 10, 20))
    )
    await assert_refused(
        manager, ErrorCode.STREAM_INNER_ERROR, commit(1, e1, CommitRange(sid, 3, 10, 20))
    )
    await assert_refused(
        manager, ErrorCode.OFFSET_NOT_MATCHED, commit(1, e1, CommitRange(sid, 2, 11, 20))
    )
    await assert_refused(
        manager, ErrorCode.OFFSET_NOT_MATCHED, commit(1, e1, CommitRange(sid, 2, 5, 20))
    )
    # a range owned by another node
    await assert_refused(
        manager, ErrorCode.STREAM_FENCED, commit(2, e2, CommitRange(sid, 2, 10, 20))
    )
    await manager.close_stream(1, e1, sid, 2)
    await assert_refused(
        manager, ErrorCode.STREAM_NOT_OPENED, commit(1, e1, CommitRange(sid, 2, 10, 20))
    )


async def test_a_stream_continues_across_pieces_of_one_commit(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    first = await manager.prepare_object(2, TTL_MS)
    await manager.commit_stream_set_object(
        1,
        e,
        first,
        first,
        10,
        [CommitRange(sid, 0, 0, 10)],
        [CommitStreamObject(first + 1, sid, 10, 20, 10)],
    )
    s = manager.stream(sid)
    assert s is not None and s.end_offset == 20


async def test_malformed_commits_are_caller_bugs(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    oid = await manager.prepare_object(1, TTL_MS)
    with pytest.raises(ValueError):
        await manager.commit_stream_set_object(1, e, -1, -1, 0, [], [])
    with pytest.raises(ValueError):
        await manager.commit_stream_set_object(1, e, oid, oid, 1, [CommitRange(sid, 0, 5, 5)], [])
    with pytest.raises(ValueError):
        await manager.commit_stream_set_object(
            1, e, oid, oid, 1, [], [CommitStreamObject(oid, sid, 0, 5, 1)]
        )


# -- compaction commits ----------------------------------------------------------------------------


async def test_compaction_replaces_ssos_and_keeps_their_order(
    manager: MetadataManager, clock: FakeClock
) -> None:
    e = await manager.register_node(1)
    a = await open_new_stream(manager, 1, e)
    b = await open_new_stream(manager, 1, e)
    t0 = clock.now
    x = await write_sso(manager, 1, e, [(a, 0, 0, 10), (b, 0, 0, 5)])
    clock.now += 10
    y = await write_sso(manager, 1, e, [(a, 0, 10, 20)])
    z = await write_sso(manager, 1, e, [(b, 0, 5, 8)])
    first = await manager.prepare_object(2, TTL_MS)
    before_streams = dict(manager.image.streams)
    clock.now += 10

    await manager.commit_stream_set_object(
        1,
        e,
        first,
        999,
        700,
        [CommitRange(b, 0, 0, 5)],
        [CommitStreamObject(first + 1, a, 0, 20, 400)],
        compacted_object_ids=[y, x],
    )

    node = manager.image.nodes[1]
    assert [s.object_id for s in node.stream_set_objects] == [first, z]
    new = node.stream_set_objects[0]
    assert (new.order_id, new.data_time_ms) == (x, t0)
    assert new.ranges == (StreamOffsetRange(b, 0, 5),)
    for oid in (x, y):
        assert manager.image.objects[oid].state is ObjectState.MARK_DESTROYED
    # compaction moves data, it does not advance offsets
    sa = manager.stream(a)
    assert sa is not None and sa.stream_objects == (StreamObject(first + 1, a, 0, 20, 400),)
    assert sa.end_offset == before_streams[a].end_offset
    assert [o.object_id for o in manager.get_objects(a, 0, -1, 10)] == [first + 1]
    assert [o.object_id for o in manager.get_objects(b, 0, -1, 10)] == [first, z]


async def test_compaction_needs_the_compacted_objects(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    a = await open_new_stream(manager, 1, e1)
    b = await open_new_stream(manager, 2, e2)
    x = await write_sso(manager, 1, e1, [(a, 0, 0, 10)])
    other_node = await write_sso(manager, 2, e2, [(b, 0, 0, 10)])
    so = await write_so(manager, 1, e1, a, 10, 20)
    new = await manager.prepare_object(1, TTL_MS)
    for compacted in ([x, 12345], [x, other_node], [x, so]):
        await assert_refused(
            manager,
            ErrorCode.COMPACTED_OBJECTS_NOT_FOUND,
            manager.commit_stream_set_object(
                1, e1, new, 0, 10, [CommitRange(a, 0, 0, 10)], [], compacted
            ),
        )


async def test_compaction_drops_data_trimmed_or_deleted_meanwhile(
    manager: MetadataManager,
) -> None:
    e = await manager.register_node(1)
    a = await open_new_stream(manager, 1, e)
    b = await open_new_stream(manager, 1, e)
    x = await write_sso(manager, 1, e, [(a, 0, 0, 10), (b, 0, 0, 10)])
    y = await write_sso(manager, 1, e, [(a, 0, 10, 20), (b, 0, 10, 20)])
    first = await manager.prepare_object(3, TTL_MS)
    # while the compaction runs: a is trimmed to 10, b is deleted
    await manager.trim_stream(1, e, a, 0, 10)
    await manager.close_stream(1, e, b, 0)
    await manager.delete_stream(1, e, b, 0)

    await manager.commit_stream_set_object(
        1,
        e,
        first,
        0,
        900,
        [CommitRange(a, 0, 0, 10), CommitRange(a, 0, 10, 20)],
        [
            CommitStreamObject(first + 1, b, 0, 20, 100),
            CommitStreamObject(first + 2, a, 5, 10, 100),
        ],
        [y],
    )

    objects = manager.image.objects
    (sso,) = manager.image.nodes[1].stream_set_objects
    assert sso.object_id == first and sso.ranges == (StreamOffsetRange(a, 10, 20),)
    assert objects[first + 1].state is ObjectState.MARK_DESTROYED  # stream b is gone
    assert objects[first + 2].state is ObjectState.MARK_DESTROYED  # wholly below a's start
    assert objects[x].state is ObjectState.MARK_DESTROYED  # emptied by the trim and delete
    assert objects[y].state is ObjectState.MARK_DESTROYED


async def test_compaction_with_nothing_left_destroys_the_new_object(
    manager: MetadataManager,
) -> None:
    e = await manager.register_node(1)
    a = await open_new_stream(manager, 1, e)
    b = await open_new_stream(manager, 1, e)
    x = await write_sso(manager, 1, e, [(a, 0, 0, 10), (b, 0, 0, 10)])
    new = await manager.prepare_object(1, TTL_MS)
    await manager.trim_stream(1, e, a, 0, 10)
    await manager.commit_stream_set_object(1, e, new, 0, 10, [CommitRange(a, 0, 0, 10)], [], [x])
    assert manager.image.nodes[1].stream_set_objects == ()
    assert manager.image.objects[new].state is ObjectState.MARK_DESTROYED


async def test_compaction_past_a_stream_end_is_refused(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    a = await open_new_stream(manager, 1, e)
    x = await write_sso(manager, 1, e, [(a, 0, 0, 10)])
    first = await manager.prepare_object(1, TTL_MS)
    await assert_refused(
        manager,
        ErrorCode.OFFSET_NOT_MATCHED,
        manager.commit_stream_set_object(1, e, first, 0, 10, [CommitRange(a, 0, 0, 11)], [], [x]),
    )


# -- stream object compaction ----------------------------------------------------------------------


async def test_stream_object_compaction_merges_sources(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    s1 = await write_so(manager, 1, e, sid, 0, 10)
    s2 = await write_so(manager, 1, e, sid, 10, 20)
    s3 = await write_so(manager, 1, e, sid, 20, 30)
    new = await manager.prepare_object(1, TTL_MS)

    await manager.commit_stream_object(new, sid, 0, 0, 20, 900, [s1, s2])

    s = manager.stream(sid)
    assert s is not None
    assert s.stream_objects == (
        StreamObject(new, sid, 0, 20, 900),
        StreamObject(s3, sid, 20, 30, 500),
    )
    assert manager.image.objects[s1].state is ObjectState.MARK_DESTROYED
    assert manager.image.objects[s2].state is ObjectState.MARK_DESTROYED
    assert manager.image.objects[new].state is ObjectState.COMMITTED
    # a retry changes nothing
    await manager.commit_stream_object(new, sid, 0, 0, 20, 900, [s1, s2])
    assert manager.stream(sid) == s


async def test_stream_object_compaction_refusals(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e, epoch=1)
    s1 = await write_so(manager, 1, e, sid, 0, 10)
    s2 = await write_so(manager, 1, e, sid, 10, 20)
    s3 = await write_so(manager, 1, e, sid, 20, 30)
    other = await open_new_stream(manager, 1, e)
    foreign = await write_so(manager, 1, e, other, 0, 10)
    new = await manager.prepare_object(1, TTL_MS)

    cases = [
        (ErrorCode.STREAM_NOT_EXIST, (new, 99, 1, 0, 20, 1, [s1, s2])),
        (ErrorCode.STREAM_FENCED, (new, sid, 0, 0, 20, 1, [s1, s2])),
        (ErrorCode.STREAM_INNER_ERROR, (new, sid, 2, 0, 20, 1, [s1, s2])),
        (ErrorCode.OBJECT_NOT_EXIST, (new + 50, sid, 1, 0, 20, 1, [s1, s2])),
        (ErrorCode.COMPACTED_OBJECTS_NOT_FOUND, (new, sid, 1, 0, 20, 1, [s1, foreign])),
        (ErrorCode.OFFSET_NOT_MATCHED, (new, sid, 1, 0, 21, 1, [s1, s2])),
        (ErrorCode.OFFSET_NOT_MATCHED, (new, sid, 1, 0, 30, 1, [s1, s3])),  # s2 in the gap
    ]
    for code, args in cases:
        await assert_refused(manager, code, manager.commit_stream_object(*args))
    with pytest.raises(ValueError):
        await manager.commit_stream_object(new, sid, 1, 0, 20, 1, [])


async def test_stream_object_compaction_without_a_new_object_frees_sources(
    manager: MetadataManager,
) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    s1 = await write_so(manager, 1, e, sid, 0, 10)
    s2 = await write_so(manager, 1, e, sid, 10, 20)
    await manager.trim_stream(1, e, sid, 0, 5)
    # epoch -1: run off the owner, no epoch check
    await manager.commit_stream_object(-1, sid, -1, 0, 0, 0, [s1])
    s = manager.stream(sid)
    assert s is not None and [x.object_id for x in s.stream_objects] == [s2]
    assert manager.image.objects[s1].state is ObjectState.MARK_DESTROYED
    assert s.ranges == (RangeMetadata(sid, 0, 0, 5, 20, 1),)
