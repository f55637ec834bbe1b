"""ObjectWAL on a real object store: the local directory store, and SeaweedFS (S3)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from storage.operator import LocalObjectStore, ObjectStore, open_object_store
from storage.operator.base import Data, ObjectInfo, SourceRange
from storage.wal import wal_object
from storage.wal.errors import WALError
from storage.wal.file_wal import WALAppendResult
from storage.wal.object_wal import ObjectWAL
from storage.wal.record import HEADER_SIZE
from tests.support.seaweedfs import SeaweedFS


class DelayedStore(ObjectStore):
    """A real store whose PUTs of chosen keys wait for ``hold`` (or fail with ``fail``)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.stats = inner.stats
        self.part_size = inner.part_size
        self.delays: list[tuple[str, asyncio.Event]] = []  # key part -> released when set
        self.failing: str | None = None

    async def put(self, key: str, data: Data, *, rate: float | None = None) -> None:
        for part, released in self.delays:
            if part in key:
                await released.wait()
        if self.failing is not None and self.failing in key:
            raise OSError(f"injected failure writing {key}")
        await self.inner.put(key, data, rate=rate)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self.inner.get(key, start, end)

    async def size(self, key: str) -> int:
        return await self.inner.size(key)

    async def compose(self, key: str, sources: Sequence[SourceRange]) -> None:
        await self.inner.compose(key, sources)

    async def delete(self, keys: Sequence[str]) -> None:
        await self.inner.delete(keys)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)

    async def close(self) -> None:
        return None


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    if request.param == "local":
        local = LocalObjectStore(tmp_path / "objects")
        yield local
        await local.close()
    else:
        server: SeaweedFS = request.getfixturevalue("s3_server")
        s3 = open_object_store(server.url())
        yield s3
        await s3.close()


Opener = Callable[..., Awaitable[ObjectWAL]]


@pytest.fixture
async def open_wal(store: ObjectStore) -> AsyncIterator[Opener]:
    """``await open_wal(epoch, **options)``: node 1's WAL in a namespace of the test's own."""
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    opened: list[ObjectWAL] = []

    async def open_(epoch: int, *, on: ObjectStore | None = None, **options: int) -> ObjectWAL:
        options.setdefault("capacity", 1 << 30)
        wal = await ObjectWAL.open(
            on or store, namespace=namespace, node_id=1, node_epoch=epoch, **options
        )
        opened.append(wal)
        return wal

    open_.namespace = namespace  # type: ignore[attr-defined]
    yield open_
    for wal in opened:
        await wal.close()


async def wal_keys(store: ObjectStore, namespace: str) -> list[str]:
    prefix = wal_object.node_prefix(namespace, 1)
    return [info.key async for info in store.list(prefix) if "epochs/" not in info.key]


def body(i: int) -> bytes:
    return f"record-{i:05d}".encode() * (1 + i % 7)


def recovered(wal: ObjectWAL) -> list[bytes]:
    return [bytes(r.body) for r in wal.recover()]


async def test_appends_share_objects_and_are_acknowledged_in_offset_order(
    open_wal: Opener, store: ObjectStore
) -> None:
    wal = await open_wal(1, batch_interval_ms=0, batch_size=1 << 20)
    assert recovered(wal) == []
    order: list[int] = []
    futures = [wal.submit(body(i), lambda f: order.append(f.result().offset)) for i in range(200)]
    results = await asyncio.gather(*futures)
    assert wal.stats.fsyncs == 1 and wal.stats.appends == 200  # one PUT for all of them
    assert order == sorted(order) == [r.offset for r in results]
    assert results[0].offset == 0 and wal.next_offset == results[-1].next_offset
    for before, after in itertools.pairwise(results):
        assert before.next_offset == after.offset
    assert results[1].offset == HEADER_SIZE + len(body(0))


async def test_a_later_object_written_first_waits_for_the_earlier_ones(
    open_wal: Opener, store: ObjectStore
) -> None:
    slow = DelayedStore(store)
    release = asyncio.Event()
    slow.delays.append((f"{0:020d}-", release))  # the first object's PUT is held
    wal = await open_wal(1, on=slow, batch_interval_ms=0)
    recovered(wal)
    acked: list[int] = []
    first = wal.submit(b"first", lambda f: acked.append(f.result().offset))
    await asyncio.sleep(0)  # the first batch is sealed: the next append makes another object
    later = [wal.submit(body(i), lambda f: acked.append(f.result().offset)) for i in range(5)]
    await asyncio.sleep(0.2)
    assert len(await wal_keys(store, open_wal.namespace)) == 1  # type: ignore[attr-defined]
    assert acked == [] and wal.next_offset == 0  # written, but behind the held one
    release.set()
    results = [await first, *await asyncio.gather(*later)]
    assert acked == [r.offset for r in results] == sorted(acked)


async def test_the_size_cap_closes_a_batch(open_wal: Opener, store: ObjectStore) -> None:
    wal = await open_wal(1, batch_interval_ms=50, batch_size=4096)
    recovered(wal)
    await asyncio.gather(*(wal.submit(bytes(1000)) for _ in range(20)))
    keys = await wal_keys(store, open_wal.namespace)  # type: ignore[attr-defined]
    assert len(keys) >= 5 and wal.stats.fsyncs == len(keys)


async def test_everything_acknowledged_survives_a_crash_and_a_zombie_is_fenced(
    open_wal: Opener, store: ObjectStore
) -> None:
    held = DelayedStore(store)
    first = await open_wal(1, on=held, batch_interval_ms=0)
    recovered(first)
    acked = [await first.append(body(i)) for i in range(30)]
    # the node freezes with appends in flight; a new incarnation takes the WAL over
    release = asyncio.Event()
    held.delays.append(("-00000000000000000001", release))
    in_flight = [first.submit(b"zombie-%d" % i) for i in range(3)]
    await asyncio.sleep(0.05)
    second = await open_wal(2)
    assert recovered(second) == [body(i) for i in range(30)]
    assert second.next_offset == acked[-1].next_offset
    # the old incarnation resumes: its objects land after the takeover
    release.set()
    await asyncio.gather(*in_flight)
    more = [await second.append(b"second-%d" % i) for i in range(3)]
    await first.close()
    third = await open_wal(3)
    assert recovered(third) == [body(i) for i in range(30)] + [b"second-%d" % i for i in range(3)]
    assert third.next_offset == more[-1].next_offset


async def test_trim_deletes_the_objects_below_it(open_wal: Opener, store: ObjectStore) -> None:
    namespace = open_wal.namespace  # type: ignore[attr-defined]
    wal = await open_wal(1, batch_interval_ms=0)
    recovered(wal)
    results = [await wal.append(body(i)) for i in range(10)]  # one object each
    assert len(await wal_keys(store, namespace)) == 10
    free = wal.free_space
    await wal.trim(results[4].offset)  # inside nothing: objects 0..3 end at or before it
    assert wal.trim_offset == results[4].offset
    assert wal.free_space == free + results[4].offset
    for _ in range(100):
        if len(await wal_keys(store, namespace)) == 6:
            break
        await asyncio.sleep(0.02)
    keys = await wal_keys(store, namespace)
    assert keys[0] == wal_object.object_key(namespace, 1, results[4].offset, 1)
    await wal.close(clean=False)
    again = await open_wal(2)
    assert recovered(again) == [body(i) for i in range(4, 10)]
    # recovery trims nothing by itself; trimming to the end deletes every object
    await again.trim(again.next_offset)
    await again.close()
    assert await wal_keys(store, namespace) == []
    last = await open_wal(3)
    assert recovered(last) == [] and last.next_offset == results[-1].next_offset


async def test_a_corrupt_object_cuts_the_log_and_appends_continue_at_the_cut(
    open_wal: Opener, store: ObjectStore
) -> None:
    namespace = open_wal.namespace  # type: ignore[attr-defined]
    wal = await open_wal(1, batch_interval_ms=0)
    recovered(wal)
    results = [await wal.append(body(i)) for i in range(6)]
    await wal.close()
    # object 3 loses its last bytes (a torn upload), object 4 a byte in its record's body
    key3 = wal_object.object_key(namespace, 1, results[3].offset, 1)
    data = await store.get(key3)
    await store.put(key3, data[:-3])
    again = await open_wal(2, batch_interval_ms=0)
    assert recovered(again) == [body(i) for i in range(3)]
    assert again.next_offset == results[3].offset
    appended = await again.append(b"after the cut")
    assert appended.offset == results[3].offset
    await again.close()
    third = await open_wal(3)
    assert recovered(third) == [body(i) for i in range(3)] + [b"after the cut"]
    # the objects past the cut are deleted, in the background, as never acknowledged (fenced
    # by epoch 2)
    past_the_cut = wal_object.object_key(namespace, 1, results[5].offset, 1)
    for _ in range(100):
        if past_the_cut not in await wal_keys(store, namespace):
            break
        await asyncio.sleep(0.02)
    assert past_the_cut not in await wal_keys(store, namespace)


async def test_another_node_recovers_a_fenced_nodes_wal(
    open_wal: Opener, store: ObjectStore
) -> None:
    namespace = open_wal.namespace  # type: ignore[attr-defined]
    node = await open_wal(4)
    recovered(node)
    results = [await node.append(body(i)) for i in range(5)]
    # node 1 is fenced at epoch 4; the controller recovers its WAL at epoch 5
    rescue = await ObjectWAL.open_for_recovery(store, namespace=namespace, node_id=1, fence_epoch=5)
    assert recovered(rescue) == [body(i) for i in range(5)]
    with pytest.raises(WALError, match="recovery only"):
        rescue.submit(b"x")
    # the fenced node writes on; the recovering node uploads, trims and is done
    await node.append(b"after the fence")
    await rescue.trim(rescue.next_offset)
    await rescue.close()
    await node.close()
    # node 1 comes back at epoch 5: nothing to replay, its log goes on at the trim point
    back = await open_wal(5)
    assert recovered(back) == []
    assert back.next_offset == results[-1].next_offset
    await back.append(b"back")
    with pytest.raises(WALError, match="newer incarnation"):
        await open_wal(4)


async def test_free_space_counts_appends_in_flight_and_capacity_bounds_a_record(
    open_wal: Opener,
) -> None:
    wal = await open_wal(1, capacity=1000, batch_interval_ms=20)
    recovered(wal)
    future = wal.submit(bytes(100))
    assert wal.free_space == 1000 - HEADER_SIZE - 100
    await future
    assert wal.free_space == 1000 - HEADER_SIZE - 100
    await wal.trim(wal.next_offset)
    assert wal.free_space == 1000
    with pytest.raises(WALError, match="larger than"):
        wal.submit(bytes(1000))


async def test_a_failed_put_fails_its_appends_and_every_later_one(
    open_wal: Opener, store: ObjectStore
) -> None:
    faulty = DelayedStore(store)
    wal = await open_wal(1, on=faulty, batch_interval_ms=0)
    recovered(wal)
    ok = await wal.append(b"ok")
    faulty.failing = f"{ok.next_offset:020d}-"
    failed: list[asyncio.Future[WALAppendResult]] = [wal.submit(b"lost")]
    await asyncio.sleep(0)
    failed.append(wal.submit(b"after"))
    for future in failed:
        with pytest.raises(WALError, match="injected failure"):
            await future
    with pytest.raises(WALError, match="failed state"):
        wal.submit(b"more")
    assert wal.next_offset == ok.next_offset


class TrimmedUnderStore(DelayedStore):
    """A store whose first GET of a WAL object first runs ``before_first_get`` (another
    incarnation trimming the log between this reader's listing and its reads)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.before_first_get: Callable[[], Awaitable[None]] | None = None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        hook, self.before_first_get = self.before_first_get, None
        if hook is not None and "epochs/" not in key:
            await hook()
        elif hook is not None:
            self.before_first_get = hook
        return await self.inner.get(key, start, end)


async def test_objects_trimmed_between_the_listing_and_the_reads_do_not_cut_the_log(
    open_wal: Opener, store: ObjectStore
) -> None:
    """A controller recovering a fenced node's WAL uploads and trims it while the node,
    started again, lists and reads it: the objects below the trim vanish between the node's
    listing and its reads. Walked as listed, the log would end at the first of them, and the
    acknowledged objects after the trim would be fenced and deleted as never acknowledged."""
    namespace = open_wal.namespace  # type: ignore[attr-defined]
    node = await open_wal(1, batch_interval_ms=0)
    recovered(node)
    results = [await node.append(body(i)) for i in range(10)]  # one object each
    await node.close(clean=False)  # killed
    rescue = await ObjectWAL.open_for_recovery(store, namespace=namespace, node_id=1, fence_epoch=2)
    assert recovered(rescue) == [body(i) for i in range(10)]
    mid = results[5].offset

    async def trimmed_meanwhile() -> None:
        await rescue.trim(mid)  # the first five are uploaded: their epoch record, then deletes
        first = wal_object.object_key(namespace, 1, results[0].offset, 1)
        for _ in range(200):
            if first not in await wal_keys(store, namespace):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the trimmed objects were never deleted")

    racing = TrimmedUnderStore(store)
    racing.before_first_get = trimmed_meanwhile
    back = await open_wal(3, on=racing)
    assert recovered(back) == [body(i) for i in range(5, 10)]
    assert back.next_offset == results[-1].next_offset
    await rescue.close()
    await back.close(clean=False)
    again = await open_wal(4)
    assert recovered(again) == [body(i) for i in range(5, 10)]
