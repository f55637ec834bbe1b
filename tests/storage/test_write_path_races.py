"""Races on the write path found in review: cancelled callers, closes with appends in flight,
a WAL holding a superseded epoch's write, shared object reads under cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from storage import stream_record_batch
from storage.block_cache import BlockCache
from storage.errors import StorageFailedError
from storage.metadata import record_codec
from storage.metadata.manager import MetadataManager
from storage.metadata.model import StreamState
from storage.object_reader import ObjectReader
from storage.object_writer import ObjectWriter
from storage.operator.local import LocalObjectStore
from storage.stream import StreamClient
from storage.stream_record_batch import StreamRecordBatch
from storage.wal import FileWAL
from tests.storage.conftest import StorageFactory
from tests.storage.metadata.helpers import NEWER_VERSION_ENTRY, append_raw
from tests.storage.test_s3_storage import read_all


async def test_cancelled_callers_do_not_leave_holes(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    calls = [asyncio.create_task(s.append(bytes([i]) * 100, 1)) for i in range(200)]
    await asyncio.sleep(0)
    for task in calls[::3]:
        task.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await storage.drain(s.stream_id)
    # every write whose offset was taken went on: the stream has no hole
    assert s.confirmed_offset == s.next_offset == 200
    assert await read_all(s) == [bytes([i]) * 100 for i in range(200)]


async def test_close_waits_for_appends_in_flight(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    s, other = await client.create_and_open(), await client.create_and_open()
    calls = [asyncio.create_task(s.append(b"x" * 500, 1)) for _ in range(100)]
    await asyncio.sleep(0)
    await s.close()
    results = await asyncio.gather(*calls, return_exceptions=True)
    acked = [r for r in results if isinstance(r, int)]
    meta = storage.metadata.stream(s.stream_id)
    assert meta is not None and meta.end_offset == len(acked) == 100  # all uploaded before close
    # the node keeps working for other streams (no upload stuck on the closed stream)
    await other.append(b"y", 1)
    await asyncio.wait_for(storage.force_upload(), 10)


async def test_recovery_prefers_the_newer_epochs_write_at_an_offset(
    tmp_path: Path, make_storage: StorageFactory
) -> None:
    metadata = await MetadataManager.open(f"sqlite:///{tmp_path}/metadata.db")
    node_epoch = await metadata.register_node(1)
    stream_id = await metadata.create_stream(1, node_epoch)
    await metadata.open_stream(1, node_epoch, stream_id, 0)
    await metadata.open_stream(1, node_epoch, stream_id, 1)
    await metadata.close()
    (tmp_path / "wal").mkdir()
    wal = await FileWAL.open(str(tmp_path / "wal" / "wal.log"), 64 << 20, node_id=1)
    # epoch 0's write at offset 0 landed unacknowledged; epoch 1 then wrote offset 0 and 1
    for epoch, offset, body in [(0, 0, b"old"), (1, 0, b"new0"), (1, 1, b"new1")]:
        await wal.append(
            stream_record_batch.encode(StreamRecordBatch(stream_id, epoch, offset, 1, body))
        )
    await wal.close(clean=False)
    storage = await make_storage()
    s = await StreamClient(storage).open(stream_id, 2)
    storage.drop_cache()
    assert await read_all(s) == [b"new0", b"new1"]


class SlowStore(LocalObjectStore):
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        await asyncio.sleep(0.2)
        return await super().get(key, start, end)

    async def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        await asyncio.sleep(0.2)
        return await super().get_view(key, start, end)


async def test_a_cancelled_reader_does_not_break_a_shared_read(tmp_path: Path) -> None:
    store = SlowStore(tmp_path)
    writer = ObjectWriter(1024)
    writer.add_all([StreamRecordBatch(1, 0, i, 1, b"z" * 300) for i in range(10)])
    built = writer.finish()
    await store.put("o/_ns/1", built.parts)
    reader = ObjectReader(store, "_ns", BlockCache(1 << 20))
    reader.key = lambda object_id: "o/_ns/1"  # type: ignore[method-assign]
    first = asyncio.create_task(reader.read(1, built.size, 1, 0, -1, 1 << 20))
    second = asyncio.create_task(reader.read(1, built.size, 1, 0, -1, 1 << 20))
    await asyncio.sleep(0.05)
    first.cancel()
    got = await second
    assert [b.base_offset for b in got] == list(range(10))
    assert first.cancelled()


async def test_every_append_listener_hears_once_whether_durable_failed_or_given_up(
    make_storage: StorageFactory,
) -> None:
    """``on_done`` is how a Produce response learns its append is settled (no done callback
    behind it): called once per append when it is durable, when its caller had cancelled its
    future, and when the storage fails under it; a failed append closes its stream."""
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    heard: list[int] = []
    durable = []
    for i in range(4):
        _, done = await s.start_append(b"d" * 100, 1, on_done=lambda i=i: heard.append(i))
        durable.append(done)
    durable[1].cancel()  # its caller gave up waiting: the write goes on all the same
    await asyncio.wait_for(asyncio.gather(*durable, return_exceptions=True), 10)
    await asyncio.sleep(0.05)
    assert sorted(heard) == [0, 1, 2, 3] and not s.closed
    heard.clear()
    failing = []
    for i in range(3):
        _, done = await s.start_append(b"f" * 100, 1, on_done=lambda i=i: heard.append(i))
        failing.append(done)
    storage.fail(OSError("injected: the disk failed"))  # before their commit runs
    assert sorted(heard) == [0, 1, 2]  # at once, in the same pass
    for done in failing:
        assert isinstance(done.exception(), StorageFailedError)
    assert s.closed  # its offsets after a failed append cannot be trusted
    await asyncio.sleep(0.05)
    assert sorted(heard) == [0, 1, 2]  # and never again


async def test_a_creation_whose_caller_is_cancelled_leaves_no_stream_open(
    make_storage: StorageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition's open cancelled while its streams' creation is committed (a stopping
    broker cancels the opens that outlast it): the store's commit goes on, as SQLite's does in
    its thread, and the streams it opened are closed again. Left open, a broker taking the
    partition over would wait for this one to close them."""
    storage = await make_storage()
    client = StreamClient(storage)
    metadata = storage.metadata
    persisting, release = asyncio.Event(), asyncio.Event()
    persist = metadata._store.persist

    async def commit_goes_on(*args: object, **kwargs: object) -> None:
        async def slow() -> None:
            await release.wait()
            await persist(*args, **kwargs)  # type: ignore[arg-type]

        commit = asyncio.ensure_future(slow())
        persisting.set()
        await asyncio.shield(commit)  # as asyncio.to_thread: cancelling stops only the wait

    monkeypatch.setattr(metadata._store, "persist", commit_goes_on)
    before = set(metadata.image.streams)
    creations = [
        lambda: client.create_and_open_many(2, 3),
        lambda: client.create_and_open_named("orders-0", lambda i: i.to_bytes(8, "big"), 3),
    ]
    for create in creations:
        persisting.clear()
        release.clear()
        caller = asyncio.create_task(create())
        await asyncio.wait_for(persisting.wait(), 5)
        caller.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
    monkeypatch.undo()
    made = {i: m for i, m in metadata.image.streams.items() if i not in before}
    assert len(made) == 3
    assert {m.state for m in made.values()} == {StreamState.CLOSED}
    assert set((await metadata._store.load()).streams) == set(metadata.image.streams)
    # the named one stays named: the next open of the partition opens it again
    named = metadata.get_kv("orders-0")
    assert named is not None and int.from_bytes(named, "big") in made


async def test_an_upload_loop_that_fails_fails_the_storage(
    make_storage: StorageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its upload loop gone nothing would empty the WAL, and appends would stall unseen
    once it is full: the storage fails instead, and says why."""
    storage = await make_storage()
    stream = await StreamClient(storage).create_and_open()
    await stream.append(b"before", 1)

    def broken() -> None:
        raise RuntimeError("injected: a bug in the upload loop")

    monkeypatch.setattr(storage.uploader, "_lift_pacing_if_behind", broken)
    storage.uploader._wanted.set()  # its next turn, at once
    for _ in range(100):
        if storage.failed is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(storage.failed, RuntimeError)
    with pytest.raises(StorageFailedError):
        await stream.append(b"after", 1)


@pytest.mark.integration
async def test_metadata_that_cannot_follow_its_store_fails_the_storage(
    make_storage: StorageFactory, postgres_url: str
) -> None:
    """Another broker's entry this version cannot read (written by a newer one) freezes the
    image: no upload can commit and no fence can be seen, so the storage takes no more
    appends, and a broker of a cluster stops its heartbeats (as for a failed WAL) and is
    fenced, rather than heartbeat on with metadata that no longer moves."""
    storage = await make_storage(**{"metadata.store.url": postgres_url})
    stream = await StreamClient(storage).create_and_open()
    await stream.append(b"before", 1)
    await append_raw(postgres_url, NEWER_VERSION_ENTRY)
    for _ in range(500):
        if storage.failed is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(storage.failed, record_codec.UnknownRecordError), storage.failed
    with pytest.raises(StorageFailedError, match="newer version"):
        await stream.append(b"after", 1)
