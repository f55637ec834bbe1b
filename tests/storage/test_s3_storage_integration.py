"""S3Storage against the real S3 server (SeaweedFS): scale, crashes, fencing, corruption, outage."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.object_format import CorruptObjectError, object_key
from storage.stream import StreamClient
from tests.storage.conftest import StorageFactory, storage_properties
from tests.storage.crash_writer import payload_for
from tests.storage.test_s3_storage import fill, read_all
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


async def test_1000_streams_round_trip_through_s3(
    s3_server: SeaweedFS, make_storage: StorageFactory
) -> None:
    storage = await make_storage(s3_server.url())
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(1000)]
    rng = random.Random(7)
    sizes = {s.stream_id: [rng.randint(200, 2000) for _ in range(8)] for s in streams}

    async def write(stream_index: int) -> None:
        s = streams[stream_index]
        for size in sizes[s.stream_id]:
            await s.append(payload_for(s.stream_id, s.next_offset, size), 2)

    await asyncio.gather(*(write(i) for i in range(len(streams))))
    await storage.force_upload()
    stats = storage.store.stats.snapshot()
    assert stats["put"] + stats["multipart_create"] <= storage.uploads + 2
    storage.drop_cache()
    gets_before = storage.store.stats.snapshot()["get"]

    async def check(index: int) -> None:
        s = streams[index]
        expected = [payload_for(s.stream_id, 2 * i, n) for i, n in enumerate(sizes[s.stream_id])]
        assert await read_all(s) == expected

    for chunk in range(0, 1000, 100):
        await asyncio.gather(*(check(i) for i in range(chunk, chunk + 100)))
    assert storage.store.stats.snapshot()["get"] > gets_before  # read from S3, not memory


def test_sigkilled_writer_loses_no_acknowledged_append(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    props = storage_properties(
        tmp_path, s3_server.url(), **{"s3.wal.upload.threshold": str(1 << 20)}
    )
    spec = json.dumps({"properties": props, "streams": 8, "seed": 3})
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.crash_writer", spec],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: dict[int, dict[int, tuple[int, int]]] = {}
    deadline = time.monotonic() + 60
    kill_after = random.Random().randint(3000, 6000)
    lines = 0
    assert child.stdout is not None
    for line in child.stdout:
        kind, *fields = line.split()
        if kind == "STREAM":
            acked[int(fields[0])] = {}
        else:
            sid, offset, count, size = map(int, fields)
            acked[sid][offset] = (count, size)
            lines += 1
        if lines >= kill_after or time.monotonic() > deadline:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert lines >= kill_after, child.stderr.read() if child.stderr else ""

    async def verify() -> None:
        from storage.config import S3StreamConfig
        from storage.s3_storage import S3Storage

        storage = await S3Storage.start(S3StreamConfig.from_properties(props))
        try:
            client = StreamClient(storage)
            for sid, appends in acked.items():
                stream = await client.open(sid, 1)  # the writer had epoch 0
                assert stream.epoch == 1
                assert stream.next_offset >= max(o + c for o, (c, _) in appends.items())
                storage.drop_cache()
                pos = 0
                got = {}
                while pos < stream.confirmed_offset:
                    for b in (await stream.fetch(pos)).batches:
                        got[b.base_offset] = (b.count, bytes(b.payload))
                        pos = b.last_offset
                for offset, (count, size) in appends.items():
                    assert got[offset] == (count, payload_for(sid, offset, size)), (sid, offset)
        finally:
            await storage.close()

    asyncio.run(verify())


async def test_stale_epoch_is_fenced_on_s3(
    s3_server: SeaweedFS, make_storage: StorageFactory
) -> None:
    storage = await make_storage(s3_server.url())
    client = StreamClient(storage)
    old = await client.create_and_open()
    await fill(old, 3)
    new = await client.open(old.stream_id, 5)
    from storage.errors import StreamFencedError

    with pytest.raises(StreamFencedError):
        await old.append(b"stale", 1)
    await fill(new, 2)
    await storage.force_upload()
    meta = storage.metadata.stream(old.stream_id)
    assert meta is not None and (meta.epoch, meta.end_offset) == (5, 15)


async def test_truncated_object_gives_a_clear_error(
    s3_server: SeaweedFS, make_storage: StorageFactory
) -> None:
    storage = await make_storage(s3_server.url(), **{"s3.stream.object.split.size": 200_000})
    client = StreamClient(storage)
    small, big = await client.create_and_open(), await client.create_and_open()
    await fill(small, 5)
    big_payloads = await fill(big, 300)
    await storage.force_upload()
    objects = storage.metadata.get_objects(small.stream_id, 0, -1, 10)
    key = object_key(storage.config.namespace, objects[0].object_id)
    data = await storage.store.get(key)
    await storage.store.put(key, data[: len(data) // 2])
    storage.drop_cache()
    with pytest.raises(CorruptObjectError, match="truncated"):
        await small.fetch(0)
    assert await read_all(big) == big_payloads  # other objects still serve


async def test_s3_outage_stalls_uploads_then_they_complete(tmp_path: Path) -> None:
    server = SeaweedFS(tmp_path / "s3", base_port=SeaweedFS.default_base_port() + 200)
    server.start()
    try:
        from storage.config import S3StreamConfig
        from storage.s3_storage import S3Storage

        props = storage_properties(tmp_path, server.url())
        storage = await S3Storage.start(S3StreamConfig.from_properties(props))
        try:
            s = await StreamClient(storage).create_and_open()
            before = await fill(s, 10)
            await storage.force_upload()
            server.stop()
            during = await fill(s, 10)  # acknowledged from the WAL while S3 is down
            upload = asyncio.create_task(storage.force_upload())
            await asyncio.sleep(4)  # several attempts (retried from 0.5 s, the delay doubling)
            assert not upload.done()
            server.restart()
            await asyncio.wait_for(upload, timeout=90)
            storage.drop_cache()
            assert await read_all(s) == before + during
        finally:
            await storage.close()
    finally:
        server.stop()


async def test_inspect_reads_an_object_from_the_bucket(
    s3_server: SeaweedFS, make_storage: StorageFactory
) -> None:
    from automq_py.log import meta_stream_record
    from automq_py.log.meta_stream_record import MetaKeyValue
    from tests.protocol.test_record_batch import make_batch

    storage = await make_storage(s3_server.url())
    client = StreamClient(storage)
    meta, log = await client.create_and_open(), await client.create_and_open()
    kv = MetaKeyValue("PARTITION", b'{"s":0,"c":0,"r":0,"cs":false}')
    await meta.append(meta_stream_record.encode(kv), 1)
    await log.append(make_batch(0), 15)
    await storage.force_upload()
    (obj,) = storage.metadata.get_objects(log.stream_id, 0, -1, 1)
    key = object_key(storage.config.namespace, obj.object_id)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "automq_py",
            "inspect",
            "--store",
            s3_server.url(),
            key,
            "--records",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].startswith(f"streamId={meta.stream_id}, startOffset=0, endOffset=1, ")
    assert lines[3].startswith(f"streamId={log.stream_id}, startOffset=0, endOffset=15, ")
    assert lines[4] == (
        f"objectId={obj.object_id}, ranges=[{meta.stream_id}:0-1, {log.stream_id}:0-15, ]"
    )
    assert 'key=PARTITION, value={"s":0,"c":0,"r":0,"cs":false}' in out.stdout
    assert "producerId=7002, producerEpoch=0, baseSequence=5400" in out.stdout
