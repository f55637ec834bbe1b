"""The object stores against the same expectations: a local directory and a real S3 server.

Tests taking ``store`` run twice, on LocalObjectStore (``file``) and on S3ObjectStore over
SeaweedFS (``s3``, marked integration). Each test works under its own key prefix.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import random
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import heap
from storage.heap import heap_buffer, size_class
from storage.operator import (
    LocalObjectStore,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    S3ObjectStore,
    open_object_store,
)
from storage.operator import local as local_module
from storage.operator.base import (
    MIN_PART_SIZE,
    CopyPart,
    UploadPart,
    plan_compose,
    plan_put_parts,
)
from tests.support.seaweedfs import SeaweedFS, default_base_port

MiB = 1 << 20

STORE_KINDS = [
    pytest.param("file", id="file"),
    pytest.param("s3", id="s3", marks=pytest.mark.integration),
]


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The url of the store under test (the same directory ``local_store`` uses)."""
    if request.param == "file":
        return (tmp_path / "objects").as_uri()
    server: SeaweedFS = request.getfixturevalue("s3_server")
    return server.url()


@pytest.fixture
def store(store_url: str, request: pytest.FixtureRequest) -> tuple[ObjectStore, str]:
    """The store under test, with the default settings, and a fresh key prefix."""
    if store_url.startswith("file:"):
        local: LocalObjectStore = request.getfixturevalue("local_store")
        return local, f"test-{uuid.uuid4().hex[:12]}/"
    s3: tuple[S3ObjectStore, str] = request.getfixturevalue("s3_store")
    return s3


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


async def put_many(store: ObjectStore, keys: list[str]) -> None:
    await asyncio.gather(*(store.put(key, key.encode()) for key in keys))


async def list_all(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    return [info async for info in store.list(prefix)]


# -- both stores --------------------------------------------------------------------------


async def test_put_get_round_trip(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    data = random_bytes(100_000)
    await objects.put(prefix + "bytes", data)
    await objects.put(prefix + "view", memoryview(data))
    await objects.put(prefix + "buffers", [data[:10], memoryview(data)[10:5000], data[5000:]])
    await objects.put(prefix + "empty", b"")

    for name in ("bytes", "view", "buffers"):
        assert await objects.get(prefix + name) == data
    assert await objects.get(prefix + "empty") == b""
    stats = objects.stats.snapshot()
    assert stats["put"] == 4
    assert stats["multipart_create"] == 0
    assert stats["bytes_put"] == 3 * len(data)
    assert stats["bytes_get"] == 3 * len(data)


async def test_ranged_get(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    key = prefix + "ranged"
    data = random_bytes(1000)
    await objects.put(key, data)

    assert await objects.get(key, 0, 10) == data[:10]
    assert await objects.get(key, 10, 20) == data[10:20]
    assert await objects.get(key, 990) == data[990:]
    assert await objects.get(key, 990, 5000) == data[990:]  # end past the object
    assert await objects.get(key, 0, 1 << 40) == data
    assert await objects.get(key, 1000) == b""  # start == size
    assert await objects.get(key, 1000, 1010) == b""
    assert await objects.get(key, 5000) == b""
    assert await objects.get(key, 7, 7) == b""
    with pytest.raises(ValueError):
        await objects.get(key, -1)
    with pytest.raises(ValueError):
        await objects.get(key, 10, 5)


async def test_ranged_view(store: tuple[ObjectStore, str]) -> None:
    """``get_view`` gives what ``get`` gives, for any alignment of the range."""
    objects, prefix = store
    key = prefix + "view"
    data = random_bytes(3 * 4096 + 100)
    await objects.put(key, data)
    for start, end in [(0, 10), (5, 4096), (4095, 8193), (4096, 8192), (100, 1 << 20)]:
        assert bytes(await objects.get_view(key, start, end)) == data[start:end]
    assert bytes(await objects.get_view(key, len(data), len(data) + 10)) == b""
    with pytest.raises(ObjectNotFoundError):
        await objects.get_view(prefix + "missing", 0, 10)


async def test_missing_key(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    key = prefix + "missing"
    with pytest.raises(ObjectNotFoundError) as raised:
        await objects.get(key)
    assert raised.value.key == key
    assert isinstance(raised.value, KeyError)
    with pytest.raises(ObjectNotFoundError):
        await objects.get(key, 10, 20)
    with pytest.raises(ObjectNotFoundError):
        await objects.get(key, 5, 5)
    with pytest.raises(ObjectNotFoundError):
        await objects.size(key)


async def test_size(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    await objects.put(prefix + "a", random_bytes(12345))
    await objects.put(prefix + "empty", b"")
    assert await objects.size(prefix + "a") == 12345
    assert await objects.size(prefix + "empty") == 0
    assert objects.stats.head == 2


async def test_multipart_put(store_url: str) -> None:
    data = random_bytes(12 * MiB, seed=1)
    # Buffer boundaries that do not line up with the 5 MiB parts.
    buffers: list[bytes | memoryview] = [
        data[: 3 * MiB + 7],
        memoryview(data)[3 * MiB + 7 : 11 * MiB],
        data[11 * MiB :],
    ]
    key = f"test-{uuid.uuid4().hex[:12]}/multipart"
    async with open_object_store(store_url, part_size=5 * MiB) as objects:
        await objects.put(key, buffers)
        stats = objects.stats.snapshot()
        assert await objects.size(key) == len(data)
        assert await objects.get(key) == data
        assert await objects.get(key, 5 * MiB - 3, 5 * MiB + 3) == data[5 * MiB - 3 : 5 * MiB + 3]
    assert stats["put"] == 0
    assert stats["multipart_create"] == 1
    assert stats["part"] == 3  # 5 + 5 + 2 MiB
    assert stats["multipart_complete"] == 1
    assert stats["bytes_put"] == len(data)


async def test_a_paced_put_spreads_its_bytes_out(store_url: str) -> None:
    """With a rate, a large object's bytes go out at about that rate (parts one at a time,
    writes a MiB at a time) and arrive whole; without, at once."""
    data = random_bytes(12 * MiB, seed=2)
    key = f"test-{uuid.uuid4().hex[:12]}/paced"
    async with open_object_store(store_url, part_size=5 * MiB) as objects:
        started = time.monotonic()
        await objects.put(key, data, rate=8 * MiB)
        paced = time.monotonic() - started
        assert await objects.get(key) == data
        started = time.monotonic()
        await objects.put(key + "-fast", data)
        fast = time.monotonic() - started
    # 12 MiB at 8 MiB/s: the last part (or MiB) starts no sooner than 1.25 s (or 1.375 s) in.
    # Unpaced takes ~0.1 s, and up to 1.1 s seen with the rest of the suite beside it.
    assert paced >= 1.25
    assert fast < paced


async def test_lifting_the_pacing_speeds_up_the_puts_in_progress(store_url: str) -> None:
    """A put paced to take 12 s finishes soon after ``lift_pacing()``, and whole; a put that
    starts after the lift is paced again."""
    data = random_bytes(12 * MiB, seed=4)
    key = f"test-{uuid.uuid4().hex[:12]}/lifted"
    async with open_object_store(store_url, part_size=5 * MiB) as objects:
        started = time.monotonic()
        put = asyncio.create_task(objects.put(key, data, rate=1 * MiB))
        await asyncio.sleep(0.5)
        assert not put.done()
        objects.lift_pacing()
        await put
        lifted = time.monotonic() - started
        assert await objects.get(key) == data
        started = time.monotonic()
        await objects.put(key + "-after", data, rate=8 * MiB)
        after = time.monotonic() - started
    # at 1 MiB/s it would take 12 s (S3: its first part, on a socket paced at 2 MiB/s, 2.5 s);
    # unpaced the rest takes ~0.1 s, ~1 s with the suite beside it
    assert lifted < 4.0
    # 12 MiB at 8 MiB/s: the last part (or MiB) starts no sooner than 1.25 s (or 1.375 s) in
    assert after >= 1.25


async def test_a_paced_object_of_one_put_is_sent_at_the_rate(store_url: str) -> None:
    """An object below the part size is paced too (S3: the kernel paces the socket), and an
    unpaced PUT beside it is not held back."""
    data = random_bytes(6 * MiB, seed=3)
    key = f"test-{uuid.uuid4().hex[:12]}/paced-one"
    async with open_object_store(store_url, part_size=16 * MiB) as objects:
        # clients and connections made up front, for paced and unpaced PUTs
        await asyncio.gather(objects.put(key, b"x", rate=4 * MiB), objects.put(key, b"x"))

        async def timed(name: str, rate: float | None) -> float:
            started = time.monotonic()
            await objects.put(name, data, rate=rate)
            return time.monotonic() - started

        paced, fast = await asyncio.gather(timed(key, 4 * MiB), timed(key + "-fast", None))
        assert await objects.get(key) == data
        assert await objects.get(key + "-fast") == data
    # 6 MiB at 4 MiB/s: 1.5 s; S3's socket is set to twice the rate, which the kernel's
    # pacing on loopback makes about 0.75 s; unpaced ~0.1 s, and up to 0.35 s measured
    # while the rest of the suite ran beside it. Held back to the rate, it would take as
    # long as the paced one.
    assert paced >= 0.6
    assert fast < 0.6 * paced


async def test_compose_copies_large_ranges(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    first, second, tail = (
        random_bytes(6 * MiB, seed=2),
        random_bytes(6 * MiB, seed=3),
        random_bytes(1000, seed=4),
    )
    await asyncio.gather(
        objects.put(prefix + "first", first),
        objects.put(prefix + "second", second),
        objects.put(prefix + "tail", tail),
    )
    before = objects.stats.snapshot()
    await objects.compose(
        prefix + "composed",
        [
            (prefix + "first", 0, 6 * MiB),
            (prefix + "second", 0, 6 * MiB),
            (prefix + "tail", 0, 1000),
        ],
    )
    after = objects.stats.snapshot()

    assert await objects.get(prefix + "composed") == first + second + tail
    assert after["part_copy"] - before["part_copy"] >= 2
    assert after["multipart_create"] - before["multipart_create"] == 1
    assert after["multipart_complete"] - before["multipart_complete"] == 1


async def test_compose_mixed_ranges(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    big = random_bytes(8 * MiB, seed=5)
    small = random_bytes(3000, seed=6)
    await objects.put(prefix + "big", big)
    await objects.put(prefix + "small", small)
    # A small piece between two large ones must be merged into a >= 5 MiB part.
    sources = [
        (prefix + "small", 100, 200),
        (prefix + "big", MiB, 7 * MiB),
        (prefix + "small", 0, 3000),
        (prefix + "big", 0, 6 * MiB),
        (prefix + "small", 5, 5),
        (prefix + "small", 2990, 3000),
    ]
    await objects.compose(prefix + "mixed", sources)
    expected = small[100:200] + big[MiB : 7 * MiB] + small + big[: 6 * MiB] + small[2990:]
    assert await objects.get(prefix + "mixed") == expected


async def test_compose_small_result_is_one_put(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    data = random_bytes(4000, seed=7)
    await objects.put(prefix + "src", data)
    before = objects.stats.snapshot()
    await objects.compose(prefix + "dst", [(prefix + "src", 10, 20), (prefix + "src", 0, 4000)])
    after = objects.stats.snapshot()
    assert await objects.get(prefix + "dst") == data[10:20] + data
    assert after["put"] - before["put"] == 1
    assert after["multipart_create"] == before["multipart_create"]


async def test_compose_errors(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    await objects.put(prefix + "src", b"0123456789")
    with pytest.raises(ObjectNotFoundError):
        await objects.compose(prefix + "dst", [(prefix + "nope", 0, 10)])
    with pytest.raises(ObjectStoreError, match="past its end"):
        await objects.compose(prefix + "dst", [(prefix + "src", 0, 11)])
    with pytest.raises(ObjectStoreError, match="past its end"):  # would be an UploadPartCopy
        await objects.compose(prefix + "dst", [(prefix + "src", 0, 6 * MiB)])
    with pytest.raises(ValueError):
        await objects.compose(prefix + "dst", [(prefix + "src", 5, 4)])


async def test_delete_batches_of_1000(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    keys = [f"{prefix}del/{i:05d}" for i in range(1500)]
    await put_many(objects, keys[:1400])  # the last 100 never existed
    await objects.put(prefix + "keep", b"k")
    before = objects.stats.delete

    await objects.delete(keys)

    assert objects.stats.delete - before == 2
    assert await list_all(objects, prefix + "del/") == []
    assert await objects.get(prefix + "keep") == b"k"
    await objects.delete([])
    assert objects.stats.delete - before == 2


async def test_list_prefix_and_continuation(store: tuple[ObjectStore, str]) -> None:
    objects, prefix = store
    keys = [f"{prefix}many/{i:05d}" for i in range(1100)]
    random.Random(8).shuffle(keys)
    await put_many(objects, keys)
    await put_many(objects, [prefix + "other/a", prefix + "other/b/c", prefix + "manx"])
    before = objects.stats.list

    listed = await list_all(objects, prefix + "many/")

    assert [(i.key, i.size) for i in listed] == [(k, len(k.encode())) for k in sorted(keys)]
    assert all(i.last_modified_ms > 0 for i in listed)
    assert objects.stats.list - before == 2  # 1,000 + 100
    assert [i.key for i in await list_all(objects, prefix + "other/")] == [
        prefix + "other/a",
        prefix + "other/b/c",
    ]
    # A prefix that ends inside a path component.
    assert len(await list_all(objects, prefix + "man")) == 1101
    assert await list_all(objects, prefix + "nothing/") == []


async def test_context_manager_closes(store_url: str) -> None:
    async with open_object_store(store_url) as objects:
        await objects.put(f"test-{uuid.uuid4().hex[:12]}/k", b"v")
    with pytest.raises(ObjectStoreError, match="closed"):
        await objects.put("test-closed/k", b"v")


# -- S3 only ------------------------------------------------------------------------------


@pytest.mark.integration
async def test_wrong_credentials_fail_fast(s3_server: SeaweedFS) -> None:
    objects = S3ObjectStore(
        s3_server.bucket,
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key="not-the-secret",
    )
    async with objects:
        started = time.monotonic()
        with pytest.raises(ObjectStoreError, match=r"PutObject 'creds/k'.*403"):
            await objects.put("creds/k", b"v")
        # A 403 is final: no retries for retry_timeout_s.
        with pytest.raises(ObjectStoreError, match="GetObject"):
            await objects.get("creds/k")
        assert time.monotonic() - started < 5
        assert objects.stats.put == 1
        assert objects.stats.get == 1


@pytest.mark.integration
async def test_missing_bucket_is_an_error(s3_server: SeaweedFS) -> None:
    async with open_object_store(s3_server.url(bucket="no-such-bucket")) as objects:
        with pytest.raises(ObjectStoreError, match="NoSuchBucket"):
            await objects.get("k")


@pytest.mark.integration
async def test_put_waits_out_an_outage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Its own server: stopping the session's one would break the other tests.
    server = SeaweedFS(tmp_path / "outage", base_port=default_base_port() + 100)
    await asyncio.to_thread(server.start)
    try:
        async with open_object_store(server.url(), retry_timeout_s=60) as objects:
            await objects.put("outage/before", b"before")
            await asyncio.to_thread(server.stop)

            caplog.set_level(logging.WARNING, logger="automq.s3")
            data = random_bytes(MiB, seed=9)
            put = asyncio.create_task(objects.put("outage/during", data))
            # (attempts at ~0, 0.1, 0.3, 0.7, 1.5 and 3.1 s: the backoff doubles from 0.1 s)
            await asyncio.sleep(4)
            assert not put.done(), "the put must wait for the server, not fail or succeed"
            retries = [r for r in caplog.records if r.name == "automq.s3"]
            assert len(retries) >= 4
            assert "PutObject 'outage/during' attempt" in retries[0].getMessage()

            await asyncio.to_thread(server.restart)  # checks the data dir survived
            await asyncio.wait_for(put, 30)

            assert await objects.get("outage/during") == data
            assert await objects.get("outage/before") == b"before"
    finally:
        server.stop()


@pytest.mark.integration
async def test_a_niced_server_yields_as_a_group(tmp_path: Path) -> None:
    # the benches' S3 server: its session's scheduling group (autogroup) and its own threads
    # at the nice value given, and still serving
    server = SeaweedFS(tmp_path / "niced", base_port=default_base_port() + 200, cpu_nice=7)
    await asyncio.to_thread(server.start)
    try:
        assert server.pid is not None
        autogroup = Path(f"/proc/{server.pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == "7"
        assert os.getpriority(os.PRIO_PROCESS, server.pid) == 7
        async with open_object_store(server.url()) as objects:
            await objects.put("niced/object", b"data")
            assert await objects.get("niced/object") == b"data"
    finally:
        server.stop()


# -- the local store ----------------------------------------------------------------------


async def test_local_keys_stay_under_the_root(local_store: LocalObjectStore) -> None:
    for key in ("", "/abs", "a/../b", "..", "a//b", "a/", "./a", "a/.b.x.automq-tmp"):
        with pytest.raises(ValueError):
            await local_store.put(key, b"x")


async def test_local_writes_leave_no_temp_files(local_store: LocalObjectStore) -> None:
    await local_store.put("a/b/c", b"one")
    await local_store.put("a/b/c", [b"two", b"!"])
    assert await local_store.get("a/b/c") == b"two!"
    files = sorted(p.relative_to(local_store.root).as_posix() for p in local_store.root.rglob("*"))
    assert files == ["a", "a/b", "a/b/c"]
    # A directory is not an object.
    with pytest.raises(ObjectNotFoundError):
        await local_store.get("a/b")
    with pytest.raises(ObjectNotFoundError):
        await local_store.size("a/b")


# sizes around the staging chunk and the O_DIRECT block, split over several buffers
_DIRECT_SIZES = [0, 1, 4095, 4096, 4097, MiB - 1, MiB, MiB + 1, 3 * MiB + 17]


@pytest.mark.parametrize("size", _DIRECT_SIZES)
async def test_local_direct_writes_keep_every_byte(
    local_store: LocalObjectStore, size: int
) -> None:
    fd = os.open(local_store.root / "probe", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert local_module._direct_io(fd), "no O_DIRECT here: the test would not test it"
    finally:
        os.close(fd)
    data = random.Random(size).randbytes(size)
    cut = size // 3
    await local_store.put(f"o/{size}", [data[:cut], data[cut : cut + 5], data[cut + 5 :]])
    assert (local_store.root / "o" / str(size)).stat().st_size == size
    assert await local_store.get(f"o/{size}") == data


@pytest.mark.parametrize("size", _DIRECT_SIZES)
async def test_local_direct_writes_from_the_stores_own_buffers(
    local_store: LocalObjectStore, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buffers from ``new_buffer`` are written from their own memory, whole blocks of them at
    least, also after bytes that went through the staging chunk and were flushed."""
    rng = random.Random(size)
    aligned = local_store.new_buffer(size)
    aligned[:] = rng.randbytes(size)
    head = rng.randbytes(MiB)  # unaligned, and one whole staging chunk: flushed before `aligned`
    parts = [head, aligned, rng.randbytes(5), aligned]  # the second `aligned` meets a full stage
    start = ctypes.addressof(ctypes.c_char.from_buffer(aligned)) if size else 0
    written_from: list[int] = []
    real = local_module._write_all

    def spy(fd: int, view: memoryview) -> None:
        written_from.append(ctypes.addressof(ctypes.c_char.from_buffer(view)))
        real(fd, view)

    monkeypatch.setattr(local_module, "_write_all", spy)
    await local_store.put(f"n/{size}", parts)
    assert await local_store.get(f"n/{size}") == b"".join(bytes(p) for p in parts)
    whole_blocks = size // 4096 * 4096
    direct = [a for a in written_from if start <= a < start + whole_blocks]
    assert len(direct) == -(-whole_blocks // MiB)  # one write per MiB of its whole blocks


async def _paced_write_sizes(
    local_store: LocalObjectStore, direct: bool, rate: float, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """The sizes of the writes a put paced at ``rate`` makes (checking every byte lands)."""
    if not direct:
        monkeypatch.setattr(local_module, "_direct_io", lambda fd: False)
    rng = random.Random(11)
    size = 3 * MiB + 17
    aligned = local_store.new_buffer(size)
    aligned[:] = rng.randbytes(size)
    parts = [rng.randbytes(5000), aligned, rng.randbytes(MiB + 3), aligned]
    sizes: list[int] = []
    real_all, real_write = local_module._write_all, os.write

    def spy_all(fd: int, view: memoryview) -> None:
        sizes.append(len(view))
        real_all(fd, view)

    def spy_write(fd: int, data: memoryview) -> int:
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(local_module, "_write_all", spy_all)
    monkeypatch.setattr(local_module.os, "write", spy_write)
    await local_store.put("paced", parts, rate=rate)
    monkeypatch.undo()
    assert await local_store.get("paced") == b"".join(bytes(p) for p in parts)
    assert sum(sizes) >= sum(len(p) for p in parts)
    return sizes


@pytest.mark.parametrize("direct", [True, False])
async def test_local_paced_writes_go_in_small_chunks(
    local_store: LocalObjectStore, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put paced at 50 MB/s writes (and, without O_DIRECT, syncs) at most ``_PACED_CHUNK``
    at a time, so a WAL write on the same disk never waits behind a large one."""
    sizes = await _paced_write_sizes(local_store, direct, 50e6, monkeypatch)
    assert max(sizes) == local_module._PACED_CHUNK < local_module._CHUNK


@pytest.mark.parametrize("direct", [True, False])
async def test_local_writes_at_a_fast_pace_take_larger_chunks(
    local_store: LocalObjectStore, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a saturated broker's pace the chunks grow with the rate (fewer writes, each a system
    call and a wait for the disk), never past ``_CHUNK``, whole blocks for O_DIRECT."""
    sizes = await _paced_write_sizes(local_store, direct, 256e6, monkeypatch)
    chunk = max(sizes)
    assert local_module._PACED_CHUNK < chunk < local_module._CHUNK
    assert chunk == int(256e6 * local_module._PACED_CHUNK_S) // 4096 * 4096
    sizes = await _paced_write_sizes(local_store, direct, 4e9, monkeypatch)
    assert max(sizes) == local_module._CHUNK


async def test_local_writes_without_direct_io(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "_direct_io", lambda fd: False)
    for size in _DIRECT_SIZES:
        data = random.Random(size).randbytes(size)
        await local_store.put(f"b/{size}", [data[:7], data[7:]])
        assert await local_store.get(f"b/{size}") == data


async def test_local_direct_write_refused_midway_starts_over_buffered(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = local_module._write_direct

    def refused(fd: int, buffers: list[memoryview], rate: float | None) -> None:
        real(fd, [memoryview(b"stale bytes that must not survive")] * 1000, rate)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(local_module, "_write_direct", refused)
    data = random.Random(7).randbytes(MiB + 3)
    await local_store.put("r", data)
    assert await local_store.get("r") == data


async def test_local_views_keep_their_memory_while_any_slice_lives(
    local_store: LocalObjectStore,
) -> None:
    """A view is read-only, and the memory it was read into stays its own while any slice of
    it lives (a cached block, a response being written), whatever is read after it."""
    data = random_bytes(2 * MiB)
    await local_store.put("v", data)
    first = await local_store.get_view("v", 0, MiB)
    assert memoryview(first).readonly
    block = memoryview(first)[4096:8192]  # as the reader cuts blocks
    del first
    second = await local_store.get_view("v", MiB, 2 * MiB)
    third = await local_store.get_view("v", 100, MiB - 100)
    assert bytes(block) == data[4096:8192]
    assert bytes(second) == data[MiB:] and bytes(third) == data[100 : MiB - 100]


def test_heap_buffers_are_page_aligned_and_freed_once_no_view_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert heap.ALLOCATOR is not None, "no malloc here: the test would not test it"
    malloc, free = heap.ALLOCATOR
    freed: list[int] = []

    def recording_free(address: int) -> None:
        freed.append(address)
        free(address)

    monkeypatch.setattr(heap, "ALLOCATOR", (malloc, recording_free))
    buffer = heap_buffer(MiB + 1)
    assert len(buffer) == MiB + 1 and not buffer.readonly
    assert ctypes.addressof(ctypes.c_char.from_buffer(buffer)) % 4096 == 0
    buffer[-1] = 7
    block = buffer[MiB:].toreadonly()
    del buffer
    assert not freed and block[0] == 7
    del block
    assert len(freed) == 1


def test_size_classes_round_up_by_an_eighth_of_a_power_of_two() -> None:
    assert size_class(1) == 4096 and size_class(MiB + 1) == MiB + 256 * 1024
    assert all(n <= size_class(n) <= n + max(4096, n // 4) for n in range(1, 5 * MiB, 9_999))


async def test_local_views_without_direct_io(tmp_path: Path) -> None:
    """Where the file system refuses O_DIRECT (tmpfs), views are read through the page cache."""
    shm = Path("/dev/shm")
    root = shm / f"automq-test-{uuid.uuid4().hex[:8]}" if shm.is_dir() else tmp_path
    store = LocalObjectStore(root)
    try:
        data = random_bytes(10_000)
        await store.put("t", data)
        assert bytes(await store.get_view("t", 3, 9_000)) == data[3:9_000]
        assert bytes(await store.get_view("t", 5000, 20_000)) == data[5000:]
    finally:
        await store.close()
        if root != tmp_path:
            import shutil

            shutil.rmtree(root)


# -- open_object_store --------------------------------------------------------------------


def test_open_file_url(tmp_path: Path) -> None:
    objects = open_object_store(tmp_path.as_uri(), part_size=MiB)
    assert isinstance(objects, LocalObjectStore)
    assert objects.root == tmp_path
    assert objects.part_size == MiB


def test_open_s3_url(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = open_object_store(
        "s3://bkt?endpoint=http://127.0.0.1:8333&region=eu-west-1&pathStyle=false"
        "&accessKey=AK&secretKey=SK",
        max_concurrency=4,
        retry_timeout_s=3,
    )
    assert isinstance(objects, S3ObjectStore)
    assert (objects.bucket, objects.endpoint, objects.region) == (
        "bkt",
        "http://127.0.0.1:8333",
        "eu-west-1",
    )
    assert (objects.max_concurrency, objects.retry_timeout_s) == (4, 3)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-ak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-sk")
    from_env = open_object_store("s3://bkt")
    assert isinstance(from_env, S3ObjectStore)
    assert from_env.region == "us-east-1"
    assert from_env.endpoint is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("gs://bucket", "scheme"),
        ("file://relative/dir", "host"),
        ("file:relative", "absolute"),
        ("s3://?endpoint=http://h", "no bucket"),
        ("s3://b/prefix", "prefix"),
        ("s3://b?endpoint=h:9000", "endpoint"),
        ("s3://b?pathStyle=maybe", "pathStyle"),
        ("s3://b?bogus=1", "unknown parameter"),
        ("s3://b?region=a&region=b", "more than once"),
        ("s3://b?accessKey=AK", "both"),
    ],
)
def test_bad_urls(url: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(ValueError, match=problem):
        open_object_store(url)


def test_s3_part_size_must_suit_s3() -> None:
    with pytest.raises(ValueError, match="part size"):
        S3ObjectStore("b", part_size=MiB)


# -- the planners -------------------------------------------------------------------------


@given(total=st.integers(0, 1 << 40), part_size=st.integers(1, 1 << 30))
def test_plan_put_parts_covers_the_object(total: int, part_size: int) -> None:
    parts = plan_put_parts(total, part_size)
    assert len(parts) <= 10_000
    assert [start for start, _ in parts] == [0, *(end for _, end in parts[:-1])][: len(parts)]
    assert (parts[-1][1] if parts else 0) == total
    assert all(end - start >= part_size for start, end in parts[:-1])


@given(lengths=st.lists(st.integers(0, 3 * MIN_PART_SIZE), max_size=12))
def test_plan_compose_parts_are_valid(lengths: list[int]) -> None:
    sources = [(f"k{i}", 7, 7 + length) for i, length in enumerate(lengths)]
    parts = plan_compose(sources)

    pieces: list[tuple[str, int, int]] = []
    for part in parts:
        pieces.extend([part.source] if isinstance(part, CopyPart) else part.sources)
    flattened = [(key, offset) for key, start, end in pieces for offset in (start, end)]
    expected = [
        (key, offset) for key, start, end in sources if end > start for offset in (start, end)
    ]
    # The pieces cover exactly the sources, in order (adjacent splits of one source merge).
    assert _merge(flattened) == _merge(expected)
    sizes = [_size(part) for part in parts]
    assert all(size >= MIN_PART_SIZE for size in sizes[:-1])
    assert all(size > 0 for size in sizes)
    assert all(
        part.source[2] - part.source[1] >= MIN_PART_SIZE
        for part in parts[:-1]
        if isinstance(part, CopyPart)
    )


def test_plan_compose_splits_huge_copies() -> None:
    parts = plan_compose([("k", 0, 12 << 30)])
    assert [p.source for p in parts if isinstance(p, CopyPart)] == [
        ("k", 0, 4 << 30),
        ("k", 4 << 30, 8 << 30),
        ("k", 8 << 30, 12 << 30),
    ]


def _size(part: CopyPart | UploadPart) -> int:
    return part.source[2] - part.source[1] if isinstance(part, CopyPart) else part.size


def _merge(points: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Drop each (end, start) pair where one piece of a key continues the previous one."""
    out: list[tuple[str, int]] = []
    for point in points:
        if len(out) % 2 == 0 and out and out[-1] == point:
            out.pop()
        else:
            out.append(point)
    return out


def test_environment_port_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOMQ_TEST_S3_BASE_PORT", "23000")
    assert default_base_port() == SeaweedFS.default_base_port() == 23000


async def test_a_large_get_arrives_whole(store: tuple[ObjectStore, str]) -> None:
    # many network chunks, each copied into the buffer as it arrives
    objects, prefix = store
    data = random_bytes(6 * MiB + 123, seed=4)
    await objects.put(prefix + "large", data)
    assert await objects.get(prefix + "large") == data
    assert await objects.get(prefix + "large", MiB + 7, 5 * MiB) == data[MiB + 7 : 5 * MiB]


async def test_a_body_shorter_than_its_content_length_is_an_error() -> None:
    """A server that closes the connection halfway through a body: the GET fails (after its
    retries) rather than return the part that came."""
    requests: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        requests.append(head.split(b" ", 1)[0])
        if head.startswith(b"GET"):
            writer.write(
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500
            )
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = (
        f"s3://bucket?endpoint=http://127.0.0.1:{port}&region=us-east-1&pathStyle=true"
        "&accessKey=ak&secretKey=sk"
    )
    try:
        async with open_object_store(url, retry_timeout_s=0.5) as objects:
            with pytest.raises(ObjectStoreError, match="GetObject 'short' failed after"):
                await objects.get("short", 0, 1000)
    finally:
        server.close()
        await server.wait_closed()
    assert requests.count(b"GET") >= 2  # retried, as any transient failure
