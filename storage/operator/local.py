"""LocalObjectStore: a directory standing in for an S3 bucket (``file://`` urls).

Keys map to files under the root; ``/`` in a key makes subdirectories. Writes are atomic and
durable (temp file, fsync, rename, fsync of the directory), so a crash leaves either the old
object or the new one. Blocking file I/O runs in worker threads. Requests are counted in
``stats`` as S3 would have issued them, so benchmarks on both stores compare.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import mmap
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from storage.heap import heap_buffer
from storage.operator.base import (
    DELETE_BATCH,
    LIST_PAGE,
    MIN_PART_SIZE,
    CopyPart,
    Data,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    RequestStats,
    SourceRange,
    as_buffers,
    check_range,
    plan_compose,
    plan_put_parts,
)

# Temp files live next to their target (so the rename stays in one directory) and are
# recognised by this suffix, which listing skips.
_TEMP_SUFFIX = ".automq-tmp"


class LocalObjectStore(ObjectStore):
    """Objects as files under ``root_dir``."""

    def __init__(self, root_dir: str | os.PathLike[str], *, part_size: int = 16 << 20) -> None:
        if part_size <= 0:
            raise ValueError(f"part size must be positive, got {part_size}")
        self.root = Path(root_dir).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.part_size = part_size
        self.stats = RequestStats()
        self._closed = False
        self._lifts = 0  # lift_pacing() calls: a paced write started before one goes unpaced
        self._read_direct = True  # O_DIRECT reads, until the file system refuses them

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    async def put(self, key: str, data: Data, *, rate: float | None = None) -> None:
        """Write the object atomically; counted as a PUT, or multipart above ``part_size``."""
        path = self._path(key)
        buffers = as_buffers(data)
        total = sum(len(b) for b in buffers)
        lifts = self._lifts
        pace = _Pace(rate, lambda: self._lifts != lifts) if rate else None
        await asyncio.to_thread(self._write, path, buffers, pace)
        if total > self.part_size:
            self.stats.multipart_create += 1
            self.stats.part += len(plan_put_parts(total, self.part_size))
            self.stats.multipart_complete += 1
        else:
            self.stats.put += 1
        self.stats.bytes_put += total

    def new_buffer(self, size: int) -> bytearray | memoryview:
        """Block-aligned memory: written with O_DIRECT from where it lies, not copied through
        the staging chunk. Not zeroed (:func:`heap_buffer`): the upload worker writes every
        byte of it, and a bytearray's zeroing took 7% of the worker's CPU, touching each page
        before the read that fills it. The heap's memory is reused from object to object, where
        a fresh mapping per object cost a page fault per 4 KiB, more CPU than the copy it
        saves."""
        return heap_buffer(size)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Read bytes ``[start, end)``; short or empty past the end of the file."""
        check_range(start, end)
        path = self._path(key)
        data = await asyncio.to_thread(self._read, key, path, start, end)
        self.stats.get += 1
        self.stats.bytes_get += len(data)
        return data

    async def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Read ``[start, end)`` with ``O_DIRECT`` (where the file system takes it) into a
        :func:`heap_buffer`, and return a read-only view of it. Objects are written with
        ``O_DIRECT``, so a read through the page cache fills it from the disk and copies out
        of it, and the first touch of each page it filled is slow on this virtual machine.
        Measured here, cold reads of 32 MiB: 1.5-2.7 s of CPU per GB into new bytes, 0.06-0.12
        s per GB direct into memory already used; a shared mapping of the file, its pages read
        in as it is made, cost the event loop's socket writes 2.4 s per GB as they first
        touched those pages."""
        check_range(start, end)
        if end <= start:
            return await self.get(key, start, end)
        path = self._path(key)
        first = start - start % _DIRECT_ALIGN
        buffer = heap_buffer(-(-end // _DIRECT_ALIGN) * _DIRECT_ALIGN - first)
        data = await asyncio.to_thread(self._read_into, key, path, start, end, first, buffer)
        self.stats.get += 1
        self.stats.bytes_get += len(data)
        return data

    def _read_into(
        self, key: str, path: Path, start: int, end: int, first: int, buffer: memoryview
    ) -> memoryview:
        direct = getattr(os, "O_DIRECT", 0) if self._read_direct else 0
        try:
            try:
                fd = os.open(path, os.O_RDONLY | direct)
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                self._read_direct = False  # tmpfs, for one
                fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        try:
            stop = min(end, os.fstat(fd).st_size)
            if start >= stop:
                return memoryview(b"")
            view = memoryview(buffer)
            wanted = stop - first
            got = 0
            while got < wanted:
                # whole blocks from an aligned offset: a direct read may pass the file's end
                n = os.preadv(fd, [view[got : len(view)]], first + got)
                if n <= 0:
                    break
                got += n
            return view[start - first : min(got, wanted)].toreadonly()
        finally:
            os.close(fd)

    async def size(self, key: str) -> int:
        """The file's size."""
        path = self._path(key)
        self.stats.head += 1
        return await asyncio.to_thread(self._size, key, path)

    async def compose(self, key: str, sources: Sequence[SourceRange]) -> None:
        """Read the source ranges and write them as one file; counted as S3 would do it."""
        path = self._path(key)
        parts = plan_compose(sources)
        paths = [(source, self._path(source[0])) for source in sources]
        chunks = await asyncio.to_thread(self._read_sources, paths)
        await asyncio.to_thread(self._write, path, [memoryview(c) for c in chunks])
        total = sum(len(c) for c in chunks)
        downloaded = sum(len(part.sources) for part in parts if not isinstance(part, CopyPart))
        if total < MIN_PART_SIZE:
            self.stats.get += len(chunks)
            self.stats.put += 1
            self.stats.bytes_get += total
            self.stats.bytes_put += total
            return
        self.stats.multipart_create += 1
        self.stats.multipart_complete += 1
        self.stats.get += downloaded
        for part in parts:
            if isinstance(part, CopyPart):
                self.stats.part_copy += 1
            else:
                self.stats.part += 1
                self.stats.bytes_get += part.size
                self.stats.bytes_put += part.size

    async def delete(self, keys: Sequence[str]) -> None:
        """Unlink the files; missing ones are fine."""
        paths = [self._path(key) for key in keys]
        await asyncio.to_thread(self._unlink_all, paths)
        self.stats.delete += -(-len(keys) // DELETE_BATCH)

    async def close(self) -> None:
        """Nothing to release; further use raises ObjectStoreError."""
        self._closed = True

    # -- blocking helpers, run in threads -------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectStoreError(f"{self!r} is closed")

    def _path(self, key: str) -> Path:
        self._check_open()
        parts = key.split("/")
        if (
            not key
            or key.startswith("/")
            or "\\" in key
            or "\0" in key
            or any(p in ("", ".", "..") for p in parts)
            or parts[-1].endswith(_TEMP_SUFFIX)
        ):
            raise ValueError(f"object key {key!r} cannot be stored as a file")
        return self.root.joinpath(*parts)

    def lift_pacing(self) -> None:
        """The paced writes in progress go on at full speed."""
        self._lifts += 1

    def _write(self, path: Path, buffers: Sequence[memoryview], pace: _Pace | None = None) -> None:
        self._make_dirs(path.parent)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                if not _direct_io(fd):
                    _write_buffered(fd, buffers, pace)
                else:
                    try:
                        _write_direct(fd, buffers, pace)
                    except OSError as e:
                        if e.errno != errno.EINVAL:
                            raise
                        # a file system that took O_DIRECT but not these writes: start over
                        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
                        os.ftruncate(fd, 0)
                        os.lseek(fd, 0, os.SEEK_SET)
                        _write_buffered(fd, buffers, pace)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def _make_dirs(self, directory: Path) -> None:
        if directory.is_dir():
            return
        self._make_dirs(directory.parent)
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            return
        # The new directory entry must itself survive a crash.
        _fsync_dir(directory.parent)

    @staticmethod
    def _read(key: str, path: Path, start: int, end: int | None) -> bytes:
        try:
            with open(path, "rb") as f:
                # Clamp to the file size: read(n) would allocate n bytes up front.
                size = os.fstat(f.fileno()).st_size
                stop = size if end is None else min(end, size)
                if start >= stop:
                    return b""
                f.seek(start)
                return f.read(stop - start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None

    @staticmethod
    def _size(key: str, path: Path) -> int:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        if not path.is_file():
            raise ObjectNotFoundError(key)
        return st.st_size

    def _read_sources(self, paths: Sequence[tuple[SourceRange, Path]]) -> list[bytes]:
        chunks = []
        for (key, start, end), path in paths:
            if start < 0 or end < start:
                raise ValueError(f"bad source range [{start}, {end}) of {key!r}")
            chunk = self._read(key, path, start, end)
            if len(chunk) != end - start:
                raise ObjectStoreError(
                    f"compose: source range [{start}, {end}) of {key!r} is past its end "
                    f"({start + len(chunk)} bytes)"
                )
            chunks.append(chunk)
        return chunks

    @staticmethod
    def _unlink_all(paths: Sequence[Path]) -> None:
        touched = set()
        for path in paths:
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                continue
            touched.add(path.parent)
        for directory in touched:
            _fsync_dir(directory)

    def _scan(self, prefix: str) -> list[ObjectInfo]:
        # Walk only the deepest directory the prefix fully names.
        top = self.root.joinpath(*prefix.split("/")[:-1]) if "/" in prefix else self.root
        infos = []
        for dirpath, _dirnames, filenames in os.walk(top):
            relative = Path(dirpath).relative_to(self.root).as_posix()
            base = "" if relative == "." else relative + "/"
            for name in filenames:
                key = base + name
                if name.endswith(_TEMP_SUFFIX) or not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # deleted while we walked
                    continue
                infos.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
        # S3 lists in the byte order of the UTF-8 keys.
        infos.sort(key=lambda info: info.key.encode())
        return infos

    # Last in the class body: above, this name would shadow the builtin in annotations.
    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield the objects under ``prefix`` in key order."""
        self._check_open()
        infos = await asyncio.to_thread(self._scan, prefix)
        self.stats.list += max(1, -(-len(infos) // LIST_PAGE))
        for info in infos:
            yield info


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Objects are written in chunks of this size: paced, and (without O_DIRECT) each synced before
# the next, so the WAL's writes to the same disk never queue behind a whole object's writeback.
_CHUNK = 1 << 20
# A paced write's chunks are smaller: a WAL write that reaches the disk while one is in flight
# waits for it. Beside 20 MB/s of paced 1 MiB direct writes this VM's 16 KiB O_DSYNC writes had
# a p99 of 4.7 ms; beside 256 KiB ones 1.6 ms, 64 KiB ones 1.0 ms, as alone (bench/README.md).
# Unpaced (a backlog, a lifted pace) the larger chunks keep the disk's throughput. A fast pace
# writes about _PACED_CHUNK_S of itself at a time, up to _CHUNK: every write is a system call,
# the virtual disk's notification and a wait for its completion, and a saturated broker's
# uploads in 128 KiB chunks cost the upload worker a quarter more CPU than in 1 MiB ones.
_PACED_CHUNK = 128 << 10
_PACED_CHUNK_S = 0.002
_DIRECT_ALIGN = 4096  # O_DIRECT wants offsets, lengths and memory aligned to the block size


def _direct_io(fd: int) -> bool:
    """Switch ``fd`` to O_DIRECT where the file system takes it (not tmpfs, for one).

    Direct writes skip the page cache: no copy into it, no writeback to schedule, no dirty
    pages for the WAL's syncs to wait behind. Written through the page cache, an object costs
    the upload worker ~2 ms of system CPU per MB on a virtual disk; direct, ~0.1 ms.
    """
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct)
    except OSError:
        return False
    return True


def _write_direct(fd: int, buffers: Sequence[memoryview], pace: _Pace | None) -> None:
    """Write the buffers with O_DIRECT. A buffer at a page-aligned address (see
    :meth:`LocalObjectStore.new_buffer`) met while the file offset is aligned is written from
    its own memory, its whole blocks at least; other bytes go through a page-aligned staging
    chunk. The last write is padded to the block size and the file truncated back to its
    length."""
    started = time.monotonic()
    total = 0
    with mmap.mmap(-1, _CHUNK, flags=mmap.MAP_PRIVATE) as stage:
        filled = 0
        stage_view = memoryview(stage)
        try:
            for buffer in buffers:
                taken = 0
                if filled == 0 and _page_aligned(buffer):
                    whole = len(buffer) - len(buffer) % _DIRECT_ALIGN
                    while taken < whole:
                        n = min(_chunk(pace), whole - taken)
                        _write_all(fd, buffer[taken : taken + n])
                        taken += n
                        total += n
                        _pace(started, total, pace)
                while taken < len(buffer):
                    chunk = _chunk(pace)
                    n = min(chunk - filled, len(buffer) - taken)
                    stage[filled : filled + n] = buffer[taken : taken + n]
                    filled += n
                    taken += n
                    if filled >= chunk:
                        _write_all(fd, stage_view[:filled])
                        total += filled
                        filled = 0
                        _pace(started, total, pace)
            if filled:
                padded = -(-filled // _DIRECT_ALIGN) * _DIRECT_ALIGN
                stage[filled:padded] = bytes(padded - filled)
                _write_all(fd, stage_view[:padded])
                total += filled
                os.ftruncate(fd, total)
        finally:
            stage_view.release()


def _write_all(fd: int, view: memoryview) -> None:
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


def _page_aligned(buffer: memoryview) -> bool:
    """Whether ``buffer`` starts at a block-aligned address and holds a whole block (only a
    writable buffer's address can be had)."""
    if buffer.readonly or len(buffer) < _DIRECT_ALIGN:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer)) % _DIRECT_ALIGN == 0


@dataclass(slots=True, frozen=True)
class _Pace:
    """A paced write's rate (bytes/s), and whether its pacing was lifted since it started."""

    rate: float
    lifted: Callable[[], bool]


_LIFT_CHECK_S = 0.05  # a paced write notices a lift within this long


def _chunk(pace: _Pace | None) -> int:
    """How much to write at a time: a paced write's small chunks (larger at a fast pace), else
    the large ones."""
    if pace is None or pace.lifted():
        return _CHUNK
    scaled = int(pace.rate * _PACED_CHUNK_S) // _DIRECT_ALIGN * _DIRECT_ALIGN
    return min(_CHUNK, max(_PACED_CHUNK, scaled))


def _pace(started: float, written: int, pace: _Pace | None) -> None:
    """At ``pace``'s rate, wait until ``written`` bytes are due since ``started`` (no longer
    once the pacing is lifted)."""
    if pace is None:
        return
    due = started + written / pace.rate
    while (wait := due - time.monotonic()) > 0 and not pace.lifted():
        time.sleep(min(wait, _LIFT_CHECK_S))


def _write_buffered(fd: int, buffers: Sequence[memoryview], pace: _Pace | None) -> None:
    started = time.monotonic()
    total = 0
    unsynced = 0
    for buffer in buffers:
        written = 0
        while written < len(buffer):
            chunk = _chunk(pace)
            n = os.write(fd, buffer[written : written + chunk])
            written += n
            unsynced += n
            total += n
            if unsynced >= chunk:
                # little dirty data at a time: the WAL's syncs, on the same disk, never wait
                # behind the whole object's writeback
                os.fdatasync(fd)
                unsynced = 0
                _pace(started, total, pace)
