"""The upload worker: a process of its own that builds objects from the WAL and writes them.

An upload reads every byte of a LogCache block, lays it out as objects and hands it to the
object store: copies, syscalls and an HTTP client's work, hundreds of milliseconds of CPU per
100 MiB. In the broker's process all of that competes with the event loop for the GIL, and
produce latency shows it at every upload. So the broker only plans an upload and commits it;
this worker, started by :class:`UploadWorker` as ``python -m storage.upload_worker``, does the
rest at a lower CPU priority (``nice``).

It needs no copy of the data: what the LogCache holds is still in the WAL file, untouched until
the upload commits and the WAL is trimmed, and a WAL record's body *is* the StreamRecordBatch an
object stores. The broker sends, per object, each stream's run as the WAL offset and size of
its records; the worker reads them with ``pread`` (the page cache serves them), checks each
against its WAL header and CRC and against the run's stream and offsets, and PUTs the object it
laid them out in (the bytes :func:`storage.upload.build_object` would make of them).

Messages both ways are msgpack maps, each framed by a 4-byte big-endian length, on the worker's
stdin and stdout (its stderr is the broker's: it logs there):

====================  ===========================================================================
request               fields
====================  ===========================================================================
``open``              ``wal_path``, ``wal_capacity``, ``store_url``, ``part_size``,
                      ``max_concurrency``, ``retry_timeout_s``: answered once the store is ready
``put``               ``id``, ``key``, ``block_size``, ``rate`` (bytes/s to write it at, or
                      nil), ``runs``: ``[stream_id, base_offset, end_offset, positions]`` with
                      positions the bytes of an ``array("q")`` of (WAL offset, size) pairs
====================  ===========================================================================

Every answer carries the request's ``id`` (0 for ``open``) and either ``size`` (bytes written)
or ``error``, plus ``requests``: the object store requests made since the previous answer, which
the broker adds to its store's counters. The worker exits when its stdin closes (the broker
closed it, or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import struct
import sys
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from storage import child_process, object_format, stream_record_batch
from storage.heap import keep_large_buffers_in_heap
from storage.log_cache import LogCacheBlock
from storage.object_format import DataBlockIndex
from storage.operator import ObjectStore, open_object_store
from storage.wal import record as wal_record
from storage.wal.header import HEADER_AREA_SIZE

log = logging.getLogger("automq.upload")

_LENGTH = struct.Struct(">I")
_MAX_MESSAGE = 1 << 30
# Below the broker's threads and its clients for the CPU: an upload may take a little longer,
# a produce request waits less (uploads are paced at the rate data arrives anyway)
WORKER_NICE = 5
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
# Object buffers kept for the next objects (see ObjectBuffers): at most this many bytes, made in
# whole steps so that objects of about one size share them, let go after this long without an
# upload
SPARE_MAX_BYTES = 128 << 20
SPARE_STEP = 8 << 20
SPARE_IDLE_S = 30.0


class UploadWorkerError(Exception):
    """The worker could not write an object, or is gone; the upload is retried."""


@dataclass(slots=True, frozen=True)
class RunSpec:
    """One stream's records in an object: ``[base_offset, end_offset)``, found in the WAL at
    ``positions`` (WAL offset, size) pairs."""

    stream_id: int
    base_offset: int
    end_offset: int
    positions: array[int]

    @classmethod
    def of(
        cls, run: Sequence[stream_record_batch.StreamRecordBatch], block: LogCacheBlock
    ) -> RunSpec:
        """The spec of ``run``, one stream's records in the LogCache ``block`` (all of them)."""
        first = run[0]
        return cls(
            first.stream_id,
            first.base_offset,
            run[-1].last_offset,
            block.wal_positions[first.stream_id],
        )


@dataclass(slots=True, frozen=True)
class WorkerSettings:
    """What the worker opens: the WAL file it reads and the object store it writes (no WAL
    file, ``wal_path`` None: an object WAL, whose uploads the broker builds itself; the worker
    is then never started)."""

    wal_path: str | None
    wal_capacity: int
    store_url: str
    part_size: int
    max_concurrency: int
    retry_timeout_s: float
    # the broker's log.format and who it is: its log lines and the worker's read alike
    log_format: str = "text"
    node_id: int = 0
    cluster_id: str = ""


class ObjectBuffers:
    """The buffers objects are built in, each kept for the next object once its upload is done.

    Memory new to the process costs a page fault per 4 KiB and the kernel's zeroing of the
    page (on a virtual machine, often the host's fault too). Freed to the C heap, an object's
    buffer was not always there for the next one, and the zeroing was a third of the worker's
    CPU (bench/README.md has the figures with and without the buffers kept).

    ``make(size)`` makes a buffer (the store's ``new_buffer``); sizes are rounded up to
    ``step``; ``take`` lends the smallest kept buffer that fits (from the thread that builds
    the object); ``give_back`` keeps what it is given while the kept buffers stay within
    ``max_bytes``."""

    def __init__(
        self,
        make: Callable[[int], bytearray | memoryview],
        max_bytes: int = SPARE_MAX_BYTES,
        step: int = SPARE_STEP,
    ) -> None:
        self._make = make
        self._max_bytes = max_bytes
        self._step = step
        self._kept: list[memoryview] = []
        self._lent: dict[int, memoryview] = {}  # id of a lent view -> the buffer it is of
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        return sum(len(buffer) for buffer in self._kept)

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes, not zeroed: the caller writes every one."""
        with self._lock:
            fitting = [i for i, buffer in enumerate(self._kept) if len(buffer) >= size]
            kept = (
                self._kept.pop(min(fitting, key=lambda i: len(self._kept[i]))) if fitting else None
            )
        buffer = (
            kept
            if kept is not None
            else memoryview(self._make(-(-size // self._step) * self._step)).cast("B")
        )
        view = buffer[:size]
        with self._lock:
            self._lent[id(view)] = buffer
        return view

    def give_back(self, view: bytearray | memoryview) -> None:
        """``view`` (from ``take``) is no longer used by anyone: keep its buffer if there is
        room."""
        with self._lock:
            buffer = self._lent.pop(id(view), None)
            if buffer is not None and self.kept_bytes + len(buffer) <= self._max_bytes:
                self._kept.append(buffer)

    def forget(self, view: bytearray | memoryview) -> None:
        """``view`` may still be in use (an upload that failed half-way): never lend it again."""
        with self._lock:
            self._lent.pop(id(view), None)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def _frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


async def _read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream."""
    try:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        if length > _MAX_MESSAGE:
            raise UploadWorkerError(f"upload worker message of {length} bytes")
        message: dict[str, Any] = msgpack.unpackb(await reader.readexactly(length), raw=False)
    except asyncio.IncompleteReadError:
        return None
    return message


def _log_start_failure(task: asyncio.Task[None]) -> None:
    # (a put waiting for the start gets the error itself; one started ahead by prepare() may
    # have no put waiting)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("upload worker did not start: %r", error)


# --- the broker's side --------------------------------------------------------------------


class UploadWorker:
    """The broker's handle on its upload worker: started by the first :meth:`put` (or ahead of
    it by :meth:`start`), started again by the next one should it die (the puts it had are
    failed, and their uploads retried)."""

    def __init__(
        self, settings: WorkerSettings, on_requests: Callable[[dict[str, int]], None]
    ) -> None:
        self._settings = settings
        self._on_requests = on_requests
        self._process: child_process.ChildProcess | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 1
        self._closed = False

    def start(self) -> None:
        """Start the process in the background (the first put waits for it if need be)."""
        if self._starting is None or self._starting.done():
            self._starting = asyncio.create_task(self._spawn(), name="upload-worker-start")
            self._starting.add_done_callback(_log_start_failure)

    @property
    def running(self) -> bool:
        """Whether the process is up (or being started)."""
        if self._process is not None and self._process.returncode is None:
            return True
        return self._starting is not None and not self._starting.done()

    def prepare(self) -> None:
        """Start the process ahead of the puts that will need it, unless it runs or is being
        started."""
        if self._closed or self._settings.wal_path is None:
            return
        gone = self._process is None or self._process.returncode is not None
        if gone and (self._starting is None or self._starting.done()):
            self.start()

    async def put(
        self, key: str, runs: Sequence[RunSpec], block_size: int, rate: float | None = None
    ) -> int:
        """Build the object ``key`` of ``runs`` (in stream order) and write it, at about
        ``rate`` bytes/s if given; its size."""
        await self._ready()
        process = self._process
        assert process is not None and process.stdin is not None
        request_id = self._next_id
        self._next_id += 1
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            process.stdin.write(
                _frame(
                    {
                        "op": "put",
                        "id": request_id,
                        "key": key,
                        "block_size": block_size,
                        "rate": rate,
                        "runs": [
                            [r.stream_id, r.base_offset, r.end_offset, r.positions.tobytes()]
                            for r in runs
                        ],
                    }
                )
            )
            await process.stdin.drain()
            result = await answer
        except (ConnectionError, BrokenPipeError) as e:
            raise UploadWorkerError(f"upload worker is gone: {e!r}") from e
        finally:
            self._pending.pop(request_id, None)
        if "error" in result:
            raise UploadWorkerError(f"upload worker could not write {key}: {result['error']}")
        return int(result["size"])

    def lift_pacing(self) -> None:
        """The puts in progress go on at full speed (no answer: a put already sent may finish
        first)."""
        process = self._process
        if process is None or process.returncode is not None or process.stdin is None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            process.stdin.write(_frame({"op": "lift"}))

    async def close(self) -> None:
        """Stop the worker: its stdin closes and it exits (killed if it does not in time)."""
        self._closed = True
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting
        await self._stop_process()

    async def _ready(self) -> None:
        if self._closed:
            raise UploadWorkerError("upload worker is closed")
        if self._settings.wal_path is None:
            raise UploadWorkerError("no WAL file for the upload worker to read")
        self.prepare()
        assert self._starting is not None
        await asyncio.shield(self._starting)
        if self._process is None:
            raise UploadWorkerError("upload worker did not start")

    async def _spawn(self) -> None:
        await self._stop_process()
        process = await child_process.spawn(
            [
                sys.executable,
                "-m",
                "storage.upload_worker",
                self._settings.log_format,
                str(self._settings.node_id),
                self._settings.cluster_id,
            ],
            stdin=child_process.PIPE,
            stdout=child_process.PIPE,
            limit=1 << 20,
        )
        assert process.stdin is not None and process.stdout is not None
        s = self._settings
        process.stdin.write(
            _frame(
                {
                    "op": "open",
                    "wal_path": s.wal_path,
                    "wal_capacity": s.wal_capacity,
                    "store_url": s.store_url,
                    "part_size": s.part_size,
                    "max_concurrency": s.max_concurrency,
                    "retry_timeout_s": s.retry_timeout_s,
                }
            )
        )
        try:
            await process.stdin.drain()
            async with asyncio.timeout(_START_TIMEOUT_S):
                ready = await _read_message(process.stdout)
        except BaseException:
            await _end(process)
            raise
        if ready is None or "error" in ready:
            code = await _end(process)
            raise UploadWorkerError(
                f"upload worker did not start (exit code {code}): "
                f"{ready.get('error') if ready else 'no answer'}"
            )
        self._process = process
        self._reader = asyncio.create_task(self._read_answers(process), name="upload-worker-read")
        log.info("upload worker started (pid %d)", process.pid)

    async def _read_answers(self, process: child_process.ChildProcess) -> None:
        assert process.stdout is not None
        failure: BaseException | None = None
        try:
            while (message := await _read_message(process.stdout)) is not None:
                self._on_requests(message.get("requests", {}))
                answer = self._pending.get(message["id"])
                if answer is not None and not answer.done():
                    answer.set_result(message)
        except Exception as e:  # a garbled stream: the worker is of no more use
            failure = e
        code = process.returncode if failure is None else None
        if self._process is process:
            self._process = None
        if not self._closed:
            log.error("upload worker %d stopped (exit code %s): %r", process.pid, code, failure)
        error = UploadWorkerError(f"upload worker stopped (exit code {code})")
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(error)

    async def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await _end(process)
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None


async def _end(process: child_process.ChildProcess) -> int | None:
    """Close the worker's stdin and wait for it to exit; kill it if it does not in time."""
    if process.stdin is not None and not process.stdin.is_closing():
        process.stdin.close()
    try:
        async with asyncio.timeout(_STOP_TIMEOUT_S):
            return await process.wait()
    except TimeoutError:
        log.warning("upload worker (pid %d) did not exit; killing it", process.pid)
        process.kill()
        return await process.wait()


# --- the worker's side ----------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class WalObject:
    """An object built from the WAL: its bytes in one buffer, and its index."""

    data: bytearray | memoryview
    index: list[DataBlockIndex]


def build_from_wal(
    fd: int,
    capacity: int,
    runs: Sequence[RunSpec],
    block_size: int,
    allocate: Callable[[int], bytearray | memoryview] = bytearray,
) -> WalObject:
    """Read ``runs`` from the WAL file ``fd`` into one object, laid out as
    :class:`storage.object_writer.ObjectWriter` lays it out (the same bytes), in a buffer from
    ``allocate`` (the store's :meth:`~storage.operator.ObjectStore.new_buffer`). Raises
    ``CorruptWALError`` or ``UploadWorkerError`` if the WAL does not hold what the runs say.

    Each record body is read by the kernel straight into its place in the object (one
    ``preadv`` per record, its WAL header beside it): the bytes are copied once, and the only
    work in Python is per record and per block, not per byte.
    """
    # the layout follows from the sizes alone: a block is one stream's, and closes once its
    # records reach block_size (a run's offsets are contiguous, which is checked as they come)
    blocks: list[tuple[int, int, int, int]] = []  # (run, first pair index, end pair index, bytes)
    for r, run in enumerate(runs):
        sizes = run.positions[1::2]
        first, filled = 0, 0
        for i, size in enumerate(sizes):
            filled += size
            if filled >= block_size:
                blocks.append((r, 2 * first, 2 * (i + 1), filled))
                first, filled = i + 1, 0
        if filled:
            blocks.append((r, 2 * first, len(run.positions), filled))
    data_size = sum(object_format.BLOCK_HEADER_SIZE + size for *_, size in blocks)
    index_size = object_format.INDEX_ENTRY_SIZE * len(blocks)
    data = allocate(data_size + index_size + object_format.FOOTER_SIZE)
    view = memoryview(data)
    wal_header = bytearray(wal_record.HEADER_SIZE)
    index: list[DataBlockIndex] = []
    expected = [run.base_offset for run in runs]
    position = 0
    for r, first, end, size in blocks:
        run = runs[r]
        pos = position + object_format.BLOCK_HEADER_SIZE
        block_start = expected[r]
        for i in range(first, end, 2):
            offset, length = run.positions[i], run.positions[i + 1]
            body = view[pos : pos + length]
            _read_record(fd, capacity, offset, wal_header, body)
            _, stream_id, _, base, count, payload = stream_record_batch.HEADER.unpack_from(body)
            if stream_id != run.stream_id or base != expected[r]:
                raise UploadWorkerError(
                    f"WAL offset {offset} holds stream {stream_id} at {base}, expected stream "
                    f"{run.stream_id} at {expected[r]}"
                )
            if stream_record_batch.HEADER_SIZE + payload != length:
                raise UploadWorkerError(f"WAL offset {offset}: a record of another size")
            expected[r] = base + count
            pos += length
        object_format.BLOCK_HEADER.pack_into(
            data,
            position,
            object_format.BLOCK_MAGIC,
            object_format.BLOCK_FLAG,
            (end - first) // 2,
            size,
        )
        block_bytes = object_format.BLOCK_HEADER_SIZE + size
        index.append(
            DataBlockIndex(
                stream_id=run.stream_id,
                start_offset=block_start,
                end_offset_delta=expected[r] - block_start,
                record_count=(end - first) // 2,
                start_position=position,
                size=block_bytes,
            )
        )
        position += block_bytes
    for run, reached in zip(runs, expected, strict=True):
        if reached != run.end_offset:
            raise UploadWorkerError(
                f"stream {run.stream_id}: the WAL records end at {reached}, expected "
                f"{run.end_offset}"
            )
    view[position : position + index_size] = object_format.encode_index(index)
    view[position + index_size :] = object_format.encode_footer(
        object_format.Footer(position, index_size)
    )
    return WalObject(data, index)


def _read_record(fd: int, capacity: int, offset: int, header: bytearray, body: memoryview) -> None:
    """Read the WAL record at ``offset`` into ``header`` and ``body`` (sized to it) and check
    it: its header, that it is a record of that size, its body CRC."""
    got = os.preadv(fd, [header, body], HEADER_AREA_SIZE + offset % capacity)
    head = wal_record.decode_header(header, offset)
    if head.is_padding or head.body_length != len(body) or got != len(header) + len(body):
        raise UploadWorkerError(
            f"WAL offset {offset}: a record of {head.body_length} bytes"
            f"{' (padding)' if head.is_padding else ''}, expected {len(body)}"
        )
    wal_record.verify_body(head, body)


def _runs(message: dict[str, Any]) -> list[RunSpec]:
    runs = []
    for stream_id, base, end, raw in message["runs"]:
        positions = array("q")
        positions.frombytes(raw)
        runs.append(RunSpec(stream_id, base, end, positions))
    return runs


class _Worker:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._fd = -1
        self._capacity = 0
        self._store: ObjectStore | None = None
        self._reported: dict[str, int] = {}
        self._objects = 0
        self._bytes = 0
        self._buffers: ObjectBuffers | None = None
        self._idle: asyncio.TimerHandle | None = None

    async def open(self, message: dict[str, Any]) -> None:
        self._fd = os.open(message["wal_path"], os.O_RDONLY)
        self._capacity = int(message["wal_capacity"])
        self._store = open_object_store(
            message["store_url"],
            part_size=int(message["part_size"]),
            max_concurrency=int(message["max_concurrency"]),
            retry_timeout_s=float(message["retry_timeout_s"]),
        )
        await self._store.connect()
        self._buffers = ObjectBuffers(self._store.new_buffer)

    async def put(self, message: dict[str, Any]) -> None:
        request_id = message["id"]
        assert self._store is not None and self._buffers is not None
        buffers = self._buffers
        if self._idle is not None:
            self._idle.cancel()
        lent: list[bytearray | memoryview] = []
        uploaded = False

        def allocate(size: int) -> bytearray | memoryview:
            lent.append(buffers.take(size))
            return lent[-1]

        try:
            built = await asyncio.to_thread(
                build_from_wal,
                self._fd,
                self._capacity,
                _runs(message),
                message["block_size"],
                allocate,
            )
            await self._store.put(message["key"], built.data, rate=message.get("rate"))
        except Exception as e:
            log.error("upload worker: writing %s failed: %r", message.get("key"), e)
            self.answer({"id": request_id, "error": repr(e)})
        else:
            uploaded = True
            self._objects += 1
            self._bytes += len(built.data)
            self.answer({"id": request_id, "size": len(built.data)})
        finally:
            for view in lent:  # (a request of a failed PUT may still hold its buffer)
                (buffers.give_back if uploaded else buffers.forget)(view)
            if self._idle is not None:
                self._idle.cancel()
            self._idle = asyncio.get_running_loop().call_later(SPARE_IDLE_S, buffers.clear)

    def lift_pacing(self) -> None:
        if self._store is not None:
            self._store.lift_pacing()

    def answer(self, message: dict[str, Any]) -> None:
        if self._store is not None:
            now = self._store.stats.full_snapshot()
            message["requests"] = {k: v - self._reported.get(k, 0) for k, v in now.items()}
            self._reported = now
        self._writer.write(_frame(message))

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        log.info(
            "upload worker: %d objects, %d bytes written; CPU %.2f s user, %.2f s system, "
            "%d page faults",
            self._objects,
            self._bytes,
            usage.ru_utime,
            usage.ru_stime,
            usage.ru_minflt,
        )
        if self._store is not None:
            await self._store.close()
        if self._fd >= 0:
            os.close(self._fd)


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    worker = _Worker(writer)
    tasks: set[asyncio.Task[None]] = set()
    try:
        opened = await _read_message(reader)
        if opened is None:
            return
        try:
            await worker.open(opened)
        except Exception as e:
            worker.answer({"id": 0, "error": repr(e)})
            await writer.drain()
            return
        worker.answer({"id": 0})
        while (message := await _read_message(reader)) is not None:
            if message.get("op") == "lift":
                worker.lift_pacing()
                continue
            if message.get("op") != "put":
                log.error("upload worker: unknown request %r", message.get("op"))
                continue
            task = asyncio.create_task(worker.put(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await writer.drain()
    finally:
        # stdin closed: the broker is done with us (or gone); what is unfinished is abandoned,
        # its objects stay PREPARED and expire
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await worker.close()


def main() -> None:
    """Entry point of ``python -m storage.upload_worker [text|json NODE_ID CLUSTER_ID]``
    (started by the broker, not users; the arguments: the broker's ``log.format`` and who it
    is, for the log lines)."""
    # the broker's own formatter: one log stream, one format (imported here, in the process
    # the broker starts, so the storage package itself does not depend on the broker's)
    from automq_py.logs import configure

    args = sys.argv[1:]
    static = {"node_id": int(args[1]), "cluster_id": args[2]} if len(args) >= 3 else {}
    configure(args[0] if args else "text", "INFO", {}, static)
    # the broker decides when the worker ends (its stdin closes): a Ctrl-C at the terminal
    # reaches the whole process group, and the broker's clean stop still needs the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    keep_large_buffers_in_heap()  # an object is built in one buffer of MiBs
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
