"""Nodes and the stream lifecycle: register, create, open (fencing), close, trim, delete."""

from __future__ import annotations

import asyncio

import pytest

from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    ErrorCode,
    MetadataError,
    ObjectState,
    RangeMetadata,
    StreamState,
)
from storage.object_format import StreamOffsetRange
from tests.storage.metadata.helpers import (
    FakeClock,
    assert_refused,
    open_new_stream,
    write_so,
    write_sso,
)

# -- nodes -----------------------------------------------------------------------------------------


async def test_register_node_starts_at_one_and_bumps_on_restart(manager: MetadataManager) -> None:
    assert await manager.register_node(7) == 1
    assert await manager.register_node(7) == 2
    assert await manager.register_node(8) == 1
    assert manager.image.nodes[7].epoch == 2
    assert manager.image.nodes[7].failover is False


async def test_a_failover_registers_the_node_only_while_its_dead_incarnation_is_the_latest(
    manager: MetadataManager,
) -> None:
    dead = await manager.register_node(7)
    assert await manager.register_node(7, replacing=dead) == dead + 1
    assert manager.image.nodes[7].failover is True
    # the node started again (or another failover came first): its epoch is left alone
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_EXPIRED, manager.register_node(7, replacing=dead)
    )
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_EXPIRED, manager.register_node(9, replacing=1)
    )
    assert manager.image.nodes[7].epoch == dead + 1 and 9 not in manager.image.nodes


async def test_register_node_rejects_negative_id(manager: MetadataManager) -> None:
    with pytest.raises(ValueError):
        await manager.register_node(-1)


async def test_unknown_node_is_refused(manager: MetadataManager) -> None:
    await assert_refused(manager, ErrorCode.NODE_EPOCH_NOT_EXIST, manager.create_stream(1, 1))


async def test_restarted_node_fences_its_old_epoch(manager: MetadataManager) -> None:
    old = await manager.register_node(1)
    new = await manager.register_node(1)
    await assert_refused(manager, ErrorCode.NODE_EPOCH_EXPIRED, manager.create_stream(1, old))
    assert await manager.create_stream(1, new) == 0


async def test_node_epoch_never_issued_is_refused(manager: MetadataManager) -> None:
    epoch = await manager.register_node(1)
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_NOT_EXIST, manager.create_stream(1, epoch + 1)
    )


# -- create / open ---------------------------------------------------------------------------------


async def test_opens_requested_together_share_one_change(manager: MetadataManager) -> None:
    """A broker taking many partitions over opens their streams in one change; an open the
    checks refuse fails alone."""
    node = await manager.register_node(1)
    ids = [await manager.create_stream(1, node) for _ in range(20)]
    await manager.open_stream(1, node, ids[0], 5)
    persisted = 0
    persist = manager._store.persist

    async def counting(records, condition=None):  # type: ignore[no-untyped-def]
        nonlocal persisted
        persisted += 1
        return await persist(records, condition)

    manager._store.persist = counting  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(manager.open_stream(1, node, i, 3) for i in ids),
        manager.open_stream(1, node, ids[1], 3),  # the same open again: in the next change
        return_exceptions=True,
    )
    assert isinstance(results[0], MetadataError)  # epoch 3 is older than its 5
    assert results[0].code is ErrorCode.STREAM_FENCED
    for stream_id in ids[1:]:
        meta = manager.image.streams[stream_id]
        assert (meta.state, meta.epoch) == (StreamState.OPENED, 3)
    assert persisted == 1  # the repeated open of one stream changed nothing


async def test_an_open_whose_caller_was_cancelled_is_left_out(manager: MetadataManager) -> None:
    """(a broker stopping cancels the opens that outlast it: none is left open behind it)"""
    node = await manager.register_node(1)
    ids = [await manager.create_stream(1, node) for _ in range(2)]
    cancelled = asyncio.create_task(manager.open_stream(1, node, ids[0], 3))
    await asyncio.sleep(0)  # queued with the next change
    cancelled.cancel()
    opened = await manager.open_stream(1, node, ids[1], 3)
    assert opened.state is StreamState.OPENED
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert manager.image.streams[ids[0]].state is StreamState.CLOSED


async def test_an_open_whose_caller_was_cancelled_in_flight_is_closed_again(
    manager: MetadataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its change is persisted: the stream is opened, and closed again, since
    its caller never learns it was opened. A stream already open here, opened again by a
    caller cancelled the same way, stays open: its first opener holds it."""
    node = await manager.register_node(1)
    ids = [await manager.create_stream(1, node) for _ in range(2)]
    await manager.open_stream(1, node, ids[1], 3)
    persisting, release = asyncio.Event(), asyncio.Event()
    persist = manager._store.persist

    async def held(*args: object, **kwargs: object) -> None:
        persisting.set()
        await release.wait()
        await persist(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(manager._store, "persist", held)
    cancelled = asyncio.create_task(manager.open_stream(1, node, ids[0], 3))
    again = asyncio.create_task(manager.open_stream(1, node, ids[1], 3))  # open already
    await asyncio.wait_for(persisting.wait(), 5)
    cancelled.cancel()
    again.cancel()
    release.set()
    for task in (cancelled, again):
        with pytest.raises(asyncio.CancelledError):
            await task
    opening = manager._opening
    assert opening is not None
    await asyncio.wait_for(opening, 5)  # the open's change, then the close after it
    assert manager.image.streams[ids[0]].state is StreamState.CLOSED
    assert manager.image.streams[ids[1]].state is StreamState.OPENED


async def test_an_open_whose_caller_is_cancelled_as_it_completes_is_closed_again(
    manager: MetadataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after its open was answered but before it resumed to learn so: the stream
    is closed again, as one cancelled in flight is (no one else holds it)."""
    node = await manager.register_node(1)
    stream_id = await manager.create_stream(1, node)
    close_abandoned = manager._close_abandoned
    callers: list[asyncio.Task[object]] = []

    async def cancel_the_caller_first(items: list[object]) -> None:
        if not items:  # the batch's own call, its answers set: the caller is about to resume
            callers[0].cancel()
        await close_abandoned(items)  # type: ignore[arg-type]

    monkeypatch.setattr(manager, "_close_abandoned", cancel_the_caller_first)
    callers.append(asyncio.create_task(manager.open_stream(1, node, stream_id, 3)))
    with pytest.raises(asyncio.CancelledError):
        await callers[0]
    assert manager.image.streams[stream_id].state is StreamState.CLOSED


async def test_a_change_whose_caller_is_cancelled_while_it_is_persisted_is_applied(
    manager: MetadataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's commit goes on once started (SQLite's, in its thread), whatever becomes of
    the caller: the image must get the change too. Without it the next stream created took
    the same id, and changes planned from the image wrote rows back as they were before."""
    node = await manager.register_node(1)
    persisting, release = asyncio.Event(), asyncio.Event()
    persist = manager._store.persist
    committed: list[asyncio.Future[None]] = []

    async def commit_goes_on(*args: object, **kwargs: object) -> None:
        async def slow() -> None:
            await release.wait()
            await persist(*args, **kwargs)  # type: ignore[arg-type]

        committed.append(asyncio.ensure_future(slow()))
        persisting.set()
        await asyncio.shield(committed[0])  # as asyncio.to_thread: cancelling stops the wait

    monkeypatch.setattr(manager._store, "persist", commit_goes_on)
    cancelled = asyncio.create_task(manager.create_stream(1, node))
    await asyncio.wait_for(persisting.wait(), 5)
    cancelled.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(committed[0], 5)
    monkeypatch.undo()
    stored = await manager._store.load()
    assert set(manager.image.streams) == set(stored.streams) != set()
    created = await manager.create_stream(1, node)
    assert created not in stored.streams


async def test_a_waiter_for_a_change_wakes_at_the_next_one_or_its_timeout(
    manager: MetadataManager,
) -> None:
    node = await manager.register_node(1)
    waiter = asyncio.create_task(manager.wait_for_change(10.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await manager.create_stream(1, node)
    await asyncio.wait_for(waiter, 1.0)  # woken by the change, long before its timeout
    started = asyncio.get_running_loop().time()
    await manager.wait_for_change(0.05)  # nothing changes: back after the timeout
    assert asyncio.get_running_loop().time() - started >= 0.04


async def test_create_stream_is_closed_at_init_epoch(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    assert await manager.create_stream(1, e) == 0
    assert await manager.create_stream(1, e) == 1
    s = manager.stream(1)
    assert s is not None
    assert (s.epoch, s.state, s.start_offset, s.end_offset) == (-1, StreamState.CLOSED, 0, 0)
    assert s.ranges == () and s.stream_objects == ()


async def test_first_open_creates_range_zero(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await manager.create_stream(1, e)
    s = await manager.open_stream(1, e, sid, 0)
    assert (s.epoch, s.state) == (0, StreamState.OPENED)
    assert s.ranges == (RangeMetadata(sid, 0, 0, 0, 0, 1),)
    assert manager.streams_opened_by(1) == [s]


async def test_open_unknown_stream(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    await assert_refused(manager, ErrorCode.STREAM_NOT_EXIST, manager.open_stream(1, e, 42, 0))


async def test_open_with_negative_epoch_is_a_caller_bug(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await manager.create_stream(1, e)
    with pytest.raises(ValueError):
        await manager.open_stream(1, e, sid, -1)


async def test_open_with_older_epoch_is_fenced(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e, epoch=3)
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.open_stream(1, e, sid, 2))


async def test_reopen_same_epoch_same_node_is_idempotent(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    before = manager.stream(sid)
    assert await manager.open_stream(1, e, sid, 0) == before


async def test_same_epoch_from_another_node_is_fenced(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1)
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.open_stream(2, e2, sid, 0))


async def test_reopen_after_close_with_same_epoch_keeps_the_range(
    manager: MetadataManager,
) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    await write_sso(manager, 1, e, [(sid, 0, 0, 10)])
    await manager.close_stream(1, e, sid, 0)
    s = await manager.open_stream(1, e, sid, 0)
    assert s.state is StreamState.OPENED
    assert s.ranges == (RangeMetadata(sid, 0, 0, 0, 10, 1),)


async def test_newer_epoch_takes_over_an_open_stream_and_fences_the_owner(
    manager: MetadataManager,
) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1)
    await write_sso(manager, 1, e1, [(sid, 0, 0, 10)])

    s = await manager.open_stream(2, e2, sid, 1)

    assert (s.epoch, s.state, s.end_offset) == (1, StreamState.OPENED, 10)
    assert s.ranges == (RangeMetadata(sid, 0, 0, 0, 10, 1), RangeMetadata(sid, 1, 1, 10, 10, 2))
    assert manager.streams_opened_by(1) == []
    assert manager.streams_opened_by(2) == [s]
    # the old owner can no longer write, close or trim
    object_id = await manager.prepare_object(1, 1000)
    await assert_refused(
        manager,
        ErrorCode.STREAM_FENCED,
        manager.commit_stream_set_object(
            1, e1, object_id, object_id, 10, [CommitRange(sid, 0, 10, 20)], []
        ),
    )
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.close_stream(1, e1, sid, 0))
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.trim_stream(1, e1, sid, 0, 5))


# -- close -----------------------------------------------------------------------------------------


async def test_close_by_owner_and_again(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    await manager.close_stream(1, e, sid, 0)
    s = manager.stream(sid)
    assert s is not None and s.state is StreamState.CLOSED
    await manager.close_stream(1, e, sid, 0)
    assert manager.stream(sid) == s


async def test_close_refusals(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1, epoch=1)
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.close_stream(1, e1, sid, 0))
    await assert_refused(manager, ErrorCode.STREAM_INNER_ERROR, manager.close_stream(1, e1, sid, 2))
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.close_stream(2, e2, sid, 1))
    await assert_refused(manager, ErrorCode.STREAM_NOT_EXIST, manager.close_stream(1, e1, 99, 0))
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_EXPIRED, manager.close_stream(1, e1 - 1, sid, 1)
    )


# -- trim ------------------------------------------------------------------------------------------


async def test_trim_frees_objects_wholly_below(manager: MetadataManager, clock: FakeClock) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1)
    other = await open_new_stream(manager, 1, e1)
    shared = await write_sso(manager, 1, e1, [(sid, 0, 0, 10), (other, 0, 0, 5)])
    so = await write_so(manager, 1, e1, sid, 10, 20)
    await manager.open_stream(2, e2, sid, 1)
    alone = await write_sso(manager, 2, e2, [(sid, 1, 20, 30)])
    tail = await write_sso(manager, 2, e2, [(sid, 1, 30, 40)])
    clock.now += 5

    await manager.trim_stream(2, e2, sid, 1, 30)

    s = manager.stream(sid)
    assert s is not None
    assert (s.start_offset, s.end_offset) == (30, 40)
    assert s.ranges == (RangeMetadata(sid, 1, 1, 30, 40, 2),)
    assert s.stream_objects == ()
    objects = manager.image.objects
    assert objects[so].state is ObjectState.MARK_DESTROYED
    assert objects[so].mark_destroyed_ms == clock.now
    # the shared SSO loses this stream's range but keeps the other stream's
    assert objects[shared].state is ObjectState.COMMITTED
    n1 = manager.image.nodes[1]
    assert [x.ranges for x in n1.stream_set_objects] == [(StreamOffsetRange(other, 0, 5),)]
    # an SSO left empty is removed and freed; the one still needed stays
    assert objects[alone].state is ObjectState.MARK_DESTROYED
    assert [x.object_id for x in manager.image.nodes[2].stream_set_objects] == [tail]
    assert objects[tail].state is ObjectState.COMMITTED


async def test_trim_inside_a_range_and_an_object_keeps_them(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    sso = await write_sso(manager, 1, e, [(sid, 0, 0, 10)])
    so = await write_so(manager, 1, e, sid, 10, 20)
    await manager.trim_stream(1, e, sid, 0, 15)
    s = manager.stream(sid)
    assert s is not None and s.start_offset == 15
    assert s.ranges == (RangeMetadata(sid, 0, 0, 15, 20, 1),)
    assert [x.object_id for x in s.stream_objects] == [so]
    assert manager.image.objects[sso].state is ObjectState.MARK_DESTROYED
    assert manager.get_objects(sid, 15, -1, 10)[0].object_id == so


async def test_trim_to_the_end_keeps_an_empty_current_range(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1)
    await write_sso(manager, 1, e1, [(sid, 0, 0, 10)])
    await manager.open_stream(2, e2, sid, 1)
    await write_sso(manager, 2, e2, [(sid, 1, 10, 20)])
    await manager.trim_stream(2, e2, sid, 1, 20)
    s = manager.stream(sid)
    assert s is not None
    assert s.ranges == (RangeMetadata(sid, 1, 1, 20, 20, 2),)
    assert manager.image.nodes[1].stream_set_objects == ()
    assert manager.image.nodes[2].stream_set_objects == ()
    # the next writer continues at the end
    await write_sso(manager, 2, e2, [(sid, 1, 20, 25)])


async def test_trim_below_or_at_start_is_a_no_op(manager: MetadataManager) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    await write_sso(manager, 1, e, [(sid, 0, 0, 10)])
    await manager.trim_stream(1, e, sid, 0, 5)
    before = manager.stream(sid)
    await manager.trim_stream(1, e, sid, 0, 5)
    await manager.trim_stream(1, e, sid, 0, 2)
    assert manager.stream(sid) == before


async def test_trim_refusals(manager: MetadataManager) -> None:
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1, epoch=1)
    await write_sso(manager, 1, e1, [(sid, 1, 0, 10)])
    await assert_refused(
        manager, ErrorCode.OFFSET_NOT_MATCHED, manager.trim_stream(1, e1, sid, 1, 11)
    )
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.trim_stream(1, e1, sid, 0, 5))
    await assert_refused(
        manager, ErrorCode.STREAM_INNER_ERROR, manager.trim_stream(1, e1, sid, 2, 5)
    )
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.trim_stream(2, e2, sid, 1, 5))
    await assert_refused(manager, ErrorCode.STREAM_NOT_EXIST, manager.trim_stream(1, e1, 9, 1, 5))
    await manager.close_stream(1, e1, sid, 1)
    await assert_refused(
        manager, ErrorCode.STREAM_NOT_OPENED, manager.trim_stream(1, e1, sid, 1, 5)
    )


# -- delete ----------------------------------------------------------------------------------------


async def test_delete_frees_the_stream_objects_and_leaves_the_ssos(
    manager: MetadataManager,
) -> None:
    e = await manager.register_node(1)
    sid = await open_new_stream(manager, 1, e)
    other = await open_new_stream(manager, 1, e)
    shared = await write_sso(manager, 1, e, [(sid, 0, 0, 10), (other, 0, 0, 5)])
    alone = await write_sso(manager, 1, e, [(sid, 0, 10, 20)])
    so = await write_so(manager, 1, e, sid, 20, 30)
    await assert_refused(manager, ErrorCode.STREAM_NOT_CLOSED, manager.delete_stream(1, e, sid, 0))
    await manager.close_stream(1, e, sid, 0)
    await assert_refused(manager, ErrorCode.STREAM_FENCED, manager.delete_stream(1, e, sid, -1))

    await manager.delete_stream(1, e, sid, 0)

    assert manager.stream(sid) is None
    objects = manager.image.objects
    assert objects[so].state is ObjectState.MARK_DESTROYED
    assert objects[alone].state is ObjectState.MARK_DESTROYED
    assert objects[shared].state is ObjectState.COMMITTED
    (left,) = manager.image.nodes[1].stream_set_objects
    assert left.ranges == (StreamOffsetRange(other, 0, 5),)
    # deleting again is fine
    await manager.delete_stream(1, e, sid, 0)


async def test_create_open_streams_is_create_then_open_in_one_transaction(
    manager: MetadataManager,
) -> None:
    other = await MetadataManager.open("sqlite://:memory:")
    try:
        for m in (manager, other):
            assert await m.register_node(1) == 1
            await m.create_stream(1, 1)  # ids do not start at 0
        made = await manager.create_open_streams(1, 1, 3, count=2)
        ids = [await other.create_stream(1, 1) for _ in range(2)]
        for stream_id in ids:
            await other.open_stream(1, 1, stream_id, 3)
        assert [s.stream_id for s in made] == ids == [1, 2]
        for stream_id in ids:
            assert manager.image.streams[stream_id] == other.image.streams[stream_id]
        assert manager.image.streams[1].state is StreamState.OPENED
        assert manager.image.streams[1].ranges == (RangeMetadata(1, 3, 0, 0, 0, 1),)
        assert await manager.create_stream(1, 1) == await other.create_stream(1, 1) == 3
        # and it survives a reload from the store, as written
        assert (await manager._store.load()).streams == manager.image.streams
    finally:
        await other.close()


async def test_create_open_streams_checks_the_node_epoch(manager: MetadataManager) -> None:
    epoch = await manager.register_node(1)
    await manager.register_node(1)
    await assert_refused(
        manager, ErrorCode.NODE_EPOCH_EXPIRED, manager.create_open_streams(1, epoch, 0)
    )
    with pytest.raises(ValueError):
        await manager.create_open_streams(1, epoch + 1, -1)


async def test_a_named_stream_is_created_once_per_key(manager: MetadataManager) -> None:
    """Two brokers creating a partition's log at once: the first names its MetaStream, the
    second creates nothing and is told so (its KV never replaces the first's)."""
    node = await manager.register_node(1)
    first = await manager.create_named_stream(1, node, 3, "ns/t/0", lambda i: str(i).encode())
    assert first is not None
    assert manager.get_kv("ns/t/0") == str(first.stream_id).encode()
    assert (first.state, first.epoch) == (StreamState.OPENED, 3)
    streams = dict(manager.image.streams)
    again = await manager.create_named_stream(1, node, 4, "ns/t/0", lambda i: str(i).encode())
    assert again is None
    assert manager.get_kv("ns/t/0") == str(first.stream_id).encode()
    assert manager.image.streams == streams  # nothing created
