"""S3Storage with its WAL in object storage (``s3.wal.path=0@...``): appends, a crash, recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from storage.operator import open_object_store
from storage.stream import StreamClient
from storage.wal import wal_object
from storage.wal.object_wal import ObjectWAL
from tests.storage.conftest import StorageFactory
from tests.storage.test_s3_storage import fill, read_all
from tests.support.seaweedfs import SeaweedFS


@pytest.fixture(
    params=[
        "own-directory",
        "data-bucket",
        pytest.param("seaweedfs", marks=pytest.mark.integration),
    ]
)
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(s3.data.buckets, s3.wal.path): the WAL in a directory store of its own, in the data
    bucket, or both on SeaweedFS."""
    if request.param == "own-directory":
        return f"0@file://{tmp_path}/objects", f"0@file://{tmp_path}/wal-objects"
    if request.param == "data-bucket":
        return f"0@file://{tmp_path}/objects", f"0@file://{tmp_path}/objects"
    server: SeaweedFS = request.getfixturevalue("s3_server")
    return f"0@{server.url()}", f"0@{server.url()}"


async def wal_objects(wal_url: str, namespace: str, node_id: int) -> list[str]:
    store = open_object_store(wal_url.split("@", 1)[1])
    try:
        prefix = wal_object.node_prefix(namespace, node_id)
        return [i.key async for i in store.list(prefix) if "epochs/" not in i.key]
    finally:
        await store.close()


async def test_appends_survive_a_crash_through_the_object_wal(
    make_storage: StorageFactory, urls: tuple[str, str]
) -> None:
    data_url, wal_url = urls
    props = {"s3.wal.path": wal_url, "cluster.id": f"c{abs(hash(wal_url)) % 10**8}"}
    storage = await make_storage(data_url, **props)
    assert isinstance(storage.wal, ObjectWAL)
    namespace = storage.config.namespace
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(4)]
    # objects over 1 MiB would be built by the upload worker from a file WAL
    sizes = [(150, 8000), (40, 1000), (40, 1000), (40, 1000)]
    filled = await asyncio.gather(
        *(fill(s, n, size=b) for s, (n, b) in zip(streams, sizes, strict=True))
    )
    written = {s.stream_id: payloads for s, payloads in zip(streams, filled, strict=True)}
    await storage.abort()  # as after a crash: the acknowledged appends are in WAL objects only
    assert await wal_objects(wal_url, namespace, 1)

    storage = await make_storage(data_url, **props)
    client = StreamClient(storage)
    for s in streams:
        meta = storage.metadata.stream(s.stream_id)
        assert meta is not None and meta.end_offset == 3 * len(written[s.stream_id])
        reopened = await client.open(s.stream_id, s.epoch + 1)
        storage.drop_cache()
        assert await read_all(reopened) == written[s.stream_id]
    assert storage.upload_worker._process is None  # every object was built in-process
    # recovery uploaded everything and trimmed the WAL: its objects go
    for _ in range(100):
        if not await wal_objects(wal_url, namespace, 1):
            break
        await asyncio.sleep(0.05)
    assert await wal_objects(wal_url, namespace, 1) == []


async def test_uploads_trim_the_object_wal(
    make_storage: StorageFactory, urls: tuple[str, str]
) -> None:
    data_url, wal_url = urls
    storage = await make_storage(
        data_url, **{"s3.wal.path": wal_url, "cluster.id": f"t{abs(hash(wal_url)) % 10**8}"}
    )
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 50)
    assert storage.wal.stats.appends == 50 and storage.wal.stats.fsyncs <= 50
    before = storage.wal.free_space
    await storage.force_upload()
    assert storage.wal.trim_offset == storage.wal.next_offset
    assert storage.wal.free_space > before
    more = await fill(s, 5)
    storage.drop_cache()
    assert await read_all(s) == payloads + more


async def test_a_trim_that_fails_is_made_by_the_next_upload(
    make_storage: StorageFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload is committed when the object WAL's trim (its epoch record's PUT) fails: the
    storage goes on taking appends, recovery would only read more, and the next upload's
    trim covers both."""
    storage = await make_storage(
        f"0@file://{tmp_path}/objects",
        **{"s3.wal.path": f"0@file://{tmp_path}/wal-objects", "cluster.id": "trimfails"},
    )
    assert isinstance(storage.wal, ObjectWAL)
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 20)
    write_epoch_record = storage.wal._write_epoch_record

    async def unreachable(offset: int) -> None:
        raise OSError("injected: the object store refused the epoch record")

    monkeypatch.setattr(storage.wal, "_write_epoch_record", unreachable)
    await storage.force_upload()
    assert storage.failed is None and storage.wal.trim_offset == 0
    monkeypatch.setattr(storage.wal, "_write_epoch_record", write_epoch_record)
    payloads += await fill(s, 5)
    await storage.force_upload()
    assert storage.wal.trim_offset == storage.wal.next_offset
    storage.drop_cache()
    assert await read_all(s) == payloads


@pytest.mark.integration
async def test_a_failover_recovers_the_dead_incarnation_only(
    make_storage: StorageFactory, postgres_url: str, tmp_path: Path
) -> None:
    """A controller recovers a fenced node's object WAL on its behalf only while the fenced
    incarnation is the node's latest. Once the node has started again (a new node epoch, its
    own recovery under way or done), a failover decided for the dead incarnation does nothing:
    a new epoch then would fence the node's own start."""
    data_url, wal_url = f"0@file://{tmp_path}/objects", f"0@file://{tmp_path}/wal-objects"
    common = {"s3.wal.path": wal_url, "metadata.store.url": postgres_url}
    survivor = await make_storage(data_url, **common, **{"node.id": "2"})

    node = await make_storage(data_url, **common)
    dead = node.node_epoch
    stream = await StreamClient(node).create_and_open()
    written = await fill(stream, 20)
    await node.abort()  # a crash: the acknowledged appends are in its WAL objects only

    restarted = await make_storage(data_url, **common)
    assert restarted.node_epoch == dead + 1
    assert await survivor.recover_node_wal(1, dead) is False
    assert survivor.metadata.image.nodes[1].epoch == dead + 1
    # the restarted node owns its streams and writes on at its epoch
    reopened = await StreamClient(restarted).open(stream.stream_id, stream.epoch + 1)
    more = await fill(reopened, 5)
    await restarted.force_upload()
    restarted.drop_cache()
    assert await read_all(reopened) == written + more

    # a crash again, fenced this time before any restart: the failover recovers its WAL
    alive = restarted.node_epoch
    more += await fill(reopened, 5)
    await restarted.abort()
    assert await survivor.recover_node_wal(1, alive) is True
    # the recovery's storage is gone with it: the metadata does not keep it (and its cache)
    assert survivor.metadata._failure_listeners == [survivor.fail]
    meta = survivor.metadata.stream(stream.stream_id)
    assert meta is not None and meta.end_offset == 3 * len(written + more)
    reader = await StreamClient(survivor).open(stream.stream_id, reopened.epoch + 1)
    assert await read_all(reader) == written + more
