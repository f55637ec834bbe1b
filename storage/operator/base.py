"""The object store interface (AutoMQ's ``S3Operator``), its errors, counters and part planners.

Every store speaks in S3 terms: whole-object PUTs (multipart above ``part_size``), ranged GETs
with an exclusive end, HEAD for the size, server-side ``compose`` from byte ranges of existing
objects, batched deletes and prefix listing. The planners at the bottom (``plan_put_parts``,
``plan_compose``) are pure so both stores share them and tests can check them without I/O.
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

# S3's limits on multipart uploads: every part but the last must be at least 5 MiB, a part
# (also an UploadPartCopy range) at most 5 GiB, and an upload has at most 10,000 parts.
MIN_PART_SIZE = 5 << 20
MAX_PART_SIZE = 5 << 30
MAX_PARTS = 10_000
# DeleteObjects takes at most 1,000 keys per request; ListObjectsV2 returns at most 1,000.
DELETE_BATCH = 1000
LIST_PAGE = 1000

Buffer = bytes | bytearray | memoryview
Data = Buffer | Sequence[Buffer]
SourceRange = tuple[str, int, int]
"""``(key, start, end)``: the bytes ``[start, end)`` of an existing object."""


@dataclass(slots=True, frozen=True)
class ObjectInfo:
    """One listed object; ``last_modified_ms`` is 0 where the store does not say."""

    key: str
    size: int
    last_modified_ms: int = 0


class ObjectNotFoundError(KeyError):
    """The object does not exist."""

    @property
    def key(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return f"object not found: {self.key}"


class ObjectStoreError(Exception):
    """A request failed for good: not retryable, or still failing when the retry time ran out."""


# upper bounds (seconds) of the request latency buckets, as Prometheus histograms count them
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_OPERATION_KEY = "op:"  # flat keys of the operation counters in a snapshot: op:<name>:<field>


@dataclass(slots=True)
class OperationStats:
    """One S3 operation's attempts: how many, how many failed, their time (microseconds) and
    how many fell in each latency bucket (the last one past every bound)."""

    attempts: int = 0
    errors: int = 0
    micros: int = 0
    buckets: list[int] = dataclasses.field(
        default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1)
    )


@dataclass(slots=True)
class RequestStats:
    """Requests issued per S3 request kind, and payload bytes moved; and per operation (its
    API name: PutObject, GetObject, ...), each attempt's outcome and time."""

    put: int = 0
    multipart_create: int = 0
    part: int = 0
    part_copy: int = 0
    multipart_complete: int = 0
    get: int = 0
    head: int = 0
    delete: int = 0
    list: int = 0
    bytes_put: int = 0
    bytes_get: int = 0
    operations: dict[str, OperationStats] = dataclasses.field(default_factory=dict)

    def timed(self, operation: str, seconds: float, failed: bool) -> None:
        """One attempt of ``operation`` took ``seconds`` (and failed, or not)."""
        stats = self.operations.get(operation)
        if stats is None:
            stats = self.operations[operation] = OperationStats()
        stats.attempts += 1
        stats.errors += failed
        stats.micros += int(seconds * 1e6)
        stats.buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def snapshot(self) -> dict[str, int]:
        """The request and byte counters as a plain dict (a copy: later requests do not
        change it)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "operations"
        }

    def full_snapshot(self) -> dict[str, int]:
        """:meth:`snapshot` and the operations' counters, flat (for :meth:`add` elsewhere)."""
        out = self.snapshot()
        for name, stats in self.operations.items():
            prefix = f"{_OPERATION_KEY}{name}:"
            out[prefix + "attempts"] = stats.attempts
            out[prefix + "errors"] = stats.errors
            out[prefix + "micros"] = stats.micros
            for i, n in enumerate(stats.buckets):
                out[f"{prefix}{i}"] = n
        return out

    def add(self, counts: Mapping[str, int]) -> None:
        """Count requests made on this store's behalf elsewhere (by the upload worker): the
        differences of two of its :meth:`full_snapshot`."""
        for f in dataclasses.fields(self):
            if f.name != "operations":
                setattr(self, f.name, getattr(self, f.name) + counts.get(f.name, 0))
        for key, n in counts.items():
            if not key.startswith(_OPERATION_KEY) or not n:
                continue
            name, _, field = key[len(_OPERATION_KEY) :].rpartition(":")
            stats = self.operations.get(name)
            if stats is None:
                stats = self.operations[name] = OperationStats()
            if field.isdigit():
                if int(field) < len(stats.buckets):
                    stats.buckets[int(field)] += n
            elif field in ("attempts", "errors", "micros"):
                setattr(stats, field, getattr(stats, field) + n)


class ObjectStore(abc.ABC):
    """An object store: S3, or a directory standing in for one."""

    stats: RequestStats
    part_size: int

    async def connect(self) -> None:
        """Make ready what the first request would otherwise set up (a client, its service
        model): called at startup, so no request in the middle of serving pays for it."""
        return None

    @abc.abstractmethod
    async def put(self, key: str, data: Data, *, rate: float | None = None) -> None:
        """Write ``data`` (a buffer or a list of buffers, concatenated) as the object ``key``.

        Above ``part_size`` bytes this is a multipart upload of ``part_size`` parts; a failed
        upload is aborted. With ``rate`` (bytes/s), a large object's bytes are sent at about
        that rate, in order, rather than all at once (its parts, or its writes to disk), until
        :meth:`lift_pacing`.
        """

    def lift_pacing(self) -> None:
        """The paced puts in progress go on at full speed (the uploads fell behind the appends,
        or everything must be in object storage now); later puts are paced as they ask."""
        return None

    def new_buffer(self, size: int) -> bytearray | memoryview:
        """A writable buffer of ``size`` bytes to build an object in, of the memory ``put``
        writes from fastest (the default: a bytearray). Its bytes may be anything: the caller
        writes every one."""
        return bytearray(size)

    @abc.abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return the bytes ``[start, end)`` of ``key`` (``end=None``: to the end).

        A range reaching past the end returns what exists, possibly nothing.
        Raises ObjectNotFoundError if the object does not exist.
        """

    async def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """The bytes ``[start, end)`` of ``key``, as :meth:`get`, for data kept a while (the
        block cache): a store may hand out a read-only view of memory it reuses once no view of
        it is left, rather than new bytes. The default is :meth:`get`."""
        return await self.get(key, start, end)

    @abc.abstractmethod
    async def size(self, key: str) -> int:
        """Return the object's size in bytes; ObjectNotFoundError if it does not exist."""

    @abc.abstractmethod
    async def compose(self, key: str, sources: Sequence[SourceRange]) -> None:
        """Write ``key`` as the concatenation of byte ranges ``(key, start, end)`` of objects.

        Raises ObjectNotFoundError if a source is missing and ObjectStoreError if a range
        reaches past its source's end.
        """

    def upload(self, key: str) -> ObjectUpload:
        """Write ``key`` piece by piece (see :class:`ObjectUpload`); nothing is visible until
        ``finish``. This default keeps every piece in memory and PUTs them at the end."""
        return BufferedUpload(self, key)

    @abc.abstractmethod
    async def delete(self, keys: Sequence[str]) -> None:
        """Delete the objects; keys that do not exist are ignored."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and threads; the store cannot be used afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class ObjectUpload(abc.ABC):
    """An object written as a sequence of appended buffers and server-side copies of byte
    ranges of other objects, for writers that must not hold the whole object in memory
    (compaction). Pieces are uploaded as they fill parts; ``finish`` makes the object visible,
    ``abort`` drops what was sent."""

    key: str
    size: int

    @abc.abstractmethod
    async def write(self, data: Data) -> None:
        """Append buffers."""

    @abc.abstractmethod
    async def copy(self, source_key: str, start: int, end: int) -> None:
        """Append the bytes ``[start, end)`` of ``source_key`` (server side where possible)."""

    @abc.abstractmethod
    async def finish(self) -> int:
        """Complete the object and return its size."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Give up: nothing of the object remains."""


class BufferedUpload(ObjectUpload):
    """An upload kept in memory and written with one ``put`` (stores without parts)."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.store = store
        self.key = key
        self.size = 0
        self._buffers: list[memoryview] = []

    async def write(self, data: Data) -> None:
        for buffer in as_buffers(data):
            self._buffers.append(buffer)
            self.size += len(buffer)

    async def copy(self, source_key: str, start: int, end: int) -> None:
        check_sources([(source_key, start, end)])
        data = await self.store.get(source_key, start, end)
        if len(data) != end - start:
            raise ObjectStoreError(
                f"copy: source range [{start}, {end}) of {source_key!r} is past its end"
            )
        await self.write(data)

    async def finish(self) -> int:
        await self.store.put(self.key, self._buffers)
        self._buffers = []
        return self.size

    async def abort(self) -> None:
        self._buffers = []


def as_buffers(data: Data) -> list[memoryview]:
    """Normalise ``put``'s argument to a list of byte memoryviews (no copies)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return [_byte_view(data)]
    return [_byte_view(b) for b in data]


def _byte_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    # A view over e.g. an array of ints must be sliced in bytes, not items.
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def slice_buffers(buffers: Sequence[memoryview], start: int, end: int) -> list[memoryview]:
    """The views covering bytes ``[start, end)`` of the buffers' concatenation."""
    out: list[memoryview] = []
    position = 0
    for buffer in buffers:
        buffer_end = position + len(buffer)
        if buffer_end > start and position < end:
            out.append(buffer[max(start - position, 0) : min(end, buffer_end) - position])
        position = buffer_end
        if position >= end:
            break
    return out


def join(buffers: Sequence[memoryview]) -> bytes | bytearray:
    """The buffers as one, without a copy when there is a single whole bytes or bytearray."""
    if (
        len(buffers) == 1
        and isinstance(buffers[0].obj, bytes | bytearray)
        and len(buffers[0]) == len(buffers[0].obj)
    ):
        return buffers[0].obj
    return b"".join(buffers)


def plan_put_parts(total: int, part_size: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of a multipart upload of ``total`` bytes.

    Parts are ``part_size`` bytes, the last one smaller; the part size grows if the object would
    otherwise need more than S3's 10,000 parts.
    """
    if part_size <= 0:
        raise ValueError(f"part size must be positive, got {part_size}")
    size = max(part_size, -(-total // MAX_PARTS))
    return [(start, min(start + size, total)) for start in range(0, total, size)]


@dataclass(slots=True, frozen=True)
class CopyPart:
    """A part copied server side (UploadPartCopy) from a range of one source object."""

    source: SourceRange


@dataclass(slots=True, frozen=True)
class UploadPart:
    """A part whose bytes are downloaded from one or more source ranges and uploaded."""

    sources: tuple[SourceRange, ...]

    @property
    def size(self) -> int:
        return sum(end - start for _, start, end in self.sources)


ComposePart = CopyPart | UploadPart


def plan_compose(
    sources: Sequence[SourceRange],
    min_part_size: int = MIN_PART_SIZE,
    max_part_size: int = MAX_PART_SIZE,
) -> list[ComposePart]:
    """Plan the multipart upload that concatenates ``sources``.

    Ranges of at least ``min_part_size`` are copied server side; smaller ones are coalesced
    with their neighbours into uploaded parts, borrowing the head of a following large range
    when needed, so that every part but the last is at least ``min_part_size`` bytes. Copied
    ranges above ``max_part_size`` are split. Empty ranges are dropped.
    """
    if not 0 < min_part_size <= max_part_size // 2:
        raise ValueError(f"bad part size bounds: {min_part_size}, {max_part_size}")
    check_sources(sources)
    parts: list[ComposePart] = []
    pending: list[SourceRange] = []
    pending_size = 0

    def copy(key: str, start: int, end: int) -> None:
        # Equal pieces, each at most max_part_size and so at least max_part_size / 2.
        count = -(-(end - start) // max_part_size)
        step = -(-(end - start) // count)
        for piece_start in range(start, end, step):
            parts.append(CopyPart((key, piece_start, min(piece_start + step, end))))

    for key, start, end in sources:
        length = end - start
        if length == 0:
            continue
        if not pending and length >= min_part_size:
            copy(key, start, end)
            continue
        borrow = min_part_size - pending_size
        if pending and length - borrow >= min_part_size:
            # Top up the pending part with the head of this range and copy the rest.
            pending.append((key, start, start + borrow))
            parts.append(UploadPart(tuple(pending)))
            pending, pending_size = [], 0
            copy(key, start + borrow, end)
            continue
        pending.append((key, start, end))
        pending_size += length
        if pending_size >= min_part_size:
            parts.append(UploadPart(tuple(pending)))
            pending, pending_size = [], 0
    if pending:
        parts.append(UploadPart(tuple(pending)))
    return parts


def check_sources(sources: Sequence[SourceRange]) -> None:
    """Raise ValueError for a malformed source range."""
    for key, start, end in sources:
        if start < 0 or end < start:
            raise ValueError(f"bad source range [{start}, {end}) of {key!r}")


def check_range(start: int, end: int | None) -> None:
    """Raise ValueError for a malformed ``get`` range."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"bad range [{start}, {end})")
