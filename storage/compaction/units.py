"""Units of maintenance work: plain functions that carry out one planned piece against object
storage and return what the driver commits. They change no metadata.

Each unit is a picklable dataclass handed to a module-level function, so a Spark executor can
run it as well as the broker's own process. The function opens its own object store from
:class:`StoreSpec`, runs its async body on a fresh event loop, closes the store, and returns a
small picklable result with the requests it issued.

* :func:`read_indexes`: the indexes of some Stream Set Objects (planning input).
* :func:`compact_stream_set_objects`: one planned SSO compaction, iteration by iteration; the
  memory it holds is one iteration's reads (``cache_size``) plus about one part being uploaded.
* :func:`compact_stream_objects`: one group of Stream Objects merged into one, by
  UploadPartCopy when every source's data is a valid part (>= 5 MiB), else read and rewritten.
* :func:`list_keys` / :func:`delete_keys`: one listing prefix, one batch of deletions.

A unit that fails deletes the objects it had written: they stay PREPARED in the metadata and
expire; nothing else refers to them.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from storage import object_format
from storage.block_cache import BlockCache
from storage.compaction.analyzer import SO, CompactionPlan, PlannedBlock, ReadRange
from storage.compaction.stream_objects import StreamObjectGroup
from storage.config import S3StreamConfig
from storage.metadata.model import CommitRange, CommitStreamObject
from storage.object_format import CorruptObjectError, DataBlockIndex, Footer
from storage.object_reader import ObjectReader
from storage.object_writer import ObjectWriter
from storage.operator import open_object_store
from storage.operator.base import MIN_PART_SIZE, ObjectInfo, ObjectStore, ObjectUpload

log = logging.getLogger("automq.compaction")

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class StoreSpec:
    """How a unit reaches object storage and lays out objects (picklable)."""

    url: str
    namespace: str
    part_size: int = 16 << 20
    block_size: int = 512 << 10
    max_concurrency: int = 32
    retry_timeout_s: float = 120.0

    @classmethod
    def from_config(cls, config: S3StreamConfig) -> StoreSpec:
        return cls(
            url=config.object_store_url,
            namespace=config.namespace,
            part_size=config.object_part_size,
            block_size=config.object_block_size,
            max_concurrency=config.max_concurrent_requests,
            retry_timeout_s=config.request_retry_timeout_ms / 1000,
        )

    def open(self) -> ObjectStore:
        return open_object_store(
            self.url,
            part_size=self.part_size,
            max_concurrency=self.max_concurrency,
            retry_timeout_s=self.retry_timeout_s,
        )

    def key(self, object_id: int) -> str:
        return object_format.object_key(self.namespace, object_id)


def _run(spec: StoreSpec, body: Callable[[ObjectStore], Awaitable[T]]) -> tuple[T, dict[str, int]]:
    """Run ``body`` with a fresh store on a fresh event loop; return its result and requests."""

    async def main() -> tuple[T, dict[str, int]]:
        store = spec.open()
        try:
            result = await body(store)
            return result, store.stats.snapshot()
        finally:
            await store.close()

    return asyncio.run(main())


# -- indexes -----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class IndexReadUnit:
    store: StoreSpec
    objects: tuple[tuple[int, int], ...]  # (object id, object size)


def read_indexes(unit: IndexReadUnit) -> dict[int, tuple[DataBlockIndex, ...]]:
    """Each object's index (footer and index block: one ranged GET of its tail, usually)."""

    async def body(store: ObjectStore) -> dict[int, tuple[DataBlockIndex, ...]]:
        reader = ObjectReader(store, unit.store.namespace, BlockCache(0))
        indexes = await asyncio.gather(*(reader.index(i, size) for i, size in unit.objects))
        return {i: tuple(index) for (i, _), index in zip(unit.objects, indexes, strict=True)}

    return _run(unit.store, body)[0]


# -- Stream Set Object compaction --------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SSOCompactionUnit:
    store: StoreSpec
    plan: CompactionPlan
    first_object_id: int  # plan.object_count ids from here: the SSO first, then the SOs
    stream_epochs: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class CompactionResult:
    """What a compaction wrote, ready for CommitStreamSetObject / CommitStreamObject."""

    object_id: int  # the new Stream Set Object (or merged Stream Object), -1 if none
    object_size: int
    ranges: tuple[CommitRange, ...]
    stream_objects: tuple[CommitStreamObject, ...]
    keys: tuple[str, ...]  # every object written, for cleanup if the commit is refused
    read_bytes: int
    written_bytes: int
    requests: dict[str, int] = field(default_factory=dict)
    copied: bool = False  # SO compaction: by UploadPartCopy


def compact_stream_set_objects(unit: SSOCompactionUnit) -> CompactionResult:
    """Carry out ``unit.plan``: read each iteration's ranges, write the new objects."""
    result, requests = _run(unit.store, lambda store: _compact_sso(unit, store))
    return dataclasses.replace(result, requests=requests)


async def _compact_sso(unit: SSOCompactionUnit, store: ObjectStore) -> CompactionResult:
    spec, plan = unit.store, unit.plan
    ids = iter(range(unit.first_object_id, unit.first_object_id + plan.object_count))
    sso_id = next(ids) if plan.has_stream_set_object else -1
    uploads: list[ObjectUpload] = []
    written: list[str] = []
    sso = ObjectWriter(spec.block_size)
    sso_upload = store.upload(spec.key(sso_id)) if sso_id >= 0 else None
    if sso_upload is not None:
        uploads.append(sso_upload)
    stream_objects: list[CommitStreamObject] = []
    read_bytes = written_bytes = 0
    try:
        for iteration in plan.iterations:
            data = await _read_all(store, spec, iteration.reads)
            read_bytes += sum(len(d) for d in data)
            where = _ReadBuffers(iteration.reads, data)
            for output in iteration.outputs:
                if output.kind == SO:
                    so_id = next(ids)
                    upload = store.upload(spec.key(so_id))
                    uploads.append(upload)
                    size, start = await _write_object(
                        upload, spec, output.blocks, where, plan.start_offsets
                    )
                    written.append(upload.key)
                    written_bytes += size
                    stream_objects.append(
                        CommitStreamObject(so_id, output.stream_id, start, output.end_offset, size)
                    )
                else:
                    assert sso_upload is not None
                    for b in output.blocks:
                        sso.add_all(_decode(where, b, spec, plan.start_offsets))
                        await sso_upload.write(sso.drain())
            del data, where  # this iteration's memory goes before the next one's reads
        sso_size = 0
        ranges: tuple[CommitRange, ...] = ()
        if sso_upload is not None:
            built = sso.finish()
            await sso_upload.write(built.parts)
            sso_size = await sso_upload.finish()
            written.append(sso_upload.key)
            written_bytes += sso_size
            ranges = tuple(
                CommitRange(
                    r.stream_id,
                    unit.stream_epochs.get(r.stream_id, 0),
                    r.start_offset,
                    r.end_offset,
                )
                for r in built.ranges
            )
    except BaseException:
        await _discard(store, uploads, written)
        raise
    return CompactionResult(
        object_id=sso_id,
        object_size=sso_size,
        ranges=ranges,
        stream_objects=tuple(stream_objects),
        keys=tuple(written),
        read_bytes=read_bytes,
        written_bytes=written_bytes,
    )


class _ReadBuffers:
    """Where each block of an iteration lies in what its ranged GETs returned. One entry per
    read, not per block: an iteration of small blocks can hold tens of thousands of them."""

    def __init__(self, reads: Sequence[ReadRange], data: Sequence[bytes]) -> None:
        self._by_object: dict[int, tuple[list[int], list[memoryview]]] = {}
        for read, buf in sorted(zip(reads, data, strict=True), key=lambda rd: rd[0].start):
            starts, views = self._by_object.setdefault(read.object_id, ([], []))
            starts.append(read.start)
            views.append(memoryview(buf))

    def block(self, b: PlannedBlock) -> memoryview:
        starts, views = self._by_object[b.object_id]
        i = bisect.bisect_right(starts, b.block.start_position) - 1
        offset = b.block.start_position - starts[i]
        return views[i][offset : offset + b.size]


def _decode(
    where: _ReadBuffers,
    b: PlannedBlock,
    spec: StoreSpec,
    start_offsets: Mapping[int, int],
) -> list[object_format.StreamRecordBatch]:
    """The batches of block ``b``, less those that end at or below their stream's start."""
    try:
        batches, end = object_format.decode_block(where.block(b))
    except CorruptObjectError as e:
        raise CorruptObjectError(f"object {spec.key(b.object_id)}: {e}") from e
    if end != b.size or not batches or batches[0].stream_id != b.block.stream_id:
        raise CorruptObjectError(
            f"object {spec.key(b.object_id)}: block at {b.block.start_position} mismatches index"
        )
    start = start_offsets.get(b.block.stream_id, -1)
    if b.block.start_offset < start:
        batches = [x for x in batches if x.last_offset > start]
    return batches


async def _write_object(
    upload: ObjectUpload,
    spec: StoreSpec,
    blocks: Sequence[PlannedBlock],
    where: _ReadBuffers,
    start_offsets: Mapping[int, int],
) -> tuple[int, int]:
    """Write ``blocks`` (one stream's) as one whole object, uploading parts as they fill; its
    size and first offset."""
    writer = ObjectWriter(spec.block_size)
    first = -1
    for b in blocks:
        batches = _decode(where, b, spec, start_offsets)
        if first < 0 and batches:
            first = batches[0].base_offset
        writer.add_all(batches)
        await upload.write(writer.drain())
    built = writer.finish()
    await upload.write(built.parts)
    return await upload.finish(), first


async def _read_all(store: ObjectStore, spec: StoreSpec, reads: Sequence[ReadRange]) -> list[bytes]:
    """Every range's bytes, through at most ``spec.max_concurrency`` requests at a time: a few
    workers rather than a task per range (an iteration may read from thousands of objects)."""
    out: list[bytes] = [b""] * len(reads)
    pending = iter(enumerate(reads))

    async def worker() -> None:
        for i, r in pending:
            out[i] = await _get_exact(store, spec.key(r.object_id), r.start, r.end)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(spec.max_concurrency, len(reads))):
                group.create_task(worker())
    except BaseExceptionGroup as e:  # the first failure, as gather would raise it
        raise e.exceptions[0] from e
    return out


async def _get_exact(store: ObjectStore, key: str, start: int, end: int) -> bytes:
    data = await store.get(key, start, end)
    if len(data) != end - start:
        raise CorruptObjectError(
            f"object {key} is truncated: [{start}, {end}) returned {len(data)} bytes"
        )
    return data


async def _discard(
    store: ObjectStore, uploads: Sequence[ObjectUpload], keys: Sequence[str]
) -> None:
    """Abort unfinished uploads and delete finished ones; failures here are only logged (the
    objects stay PREPARED, expire, and GC removes them)."""
    for upload in uploads:
        with contextlib.suppress(Exception):
            await upload.abort()
    if keys:
        try:
            await store.delete(list(keys))
        except Exception as e:
            log.warning("could not delete %d objects of a failed compaction: %s", len(keys), e)


# -- Stream Object compaction ------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SOCompactionUnit:
    store: StoreSpec
    group: StreamObjectGroup
    object_id: int


def compact_stream_objects(unit: SOCompactionUnit) -> CompactionResult:
    """Merge ``unit.group`` into object ``unit.object_id``."""
    result, requests = _run(unit.store, lambda store: _compact_so(unit, store))
    return dataclasses.replace(result, requests=requests)


async def _compact_so(unit: SOCompactionUnit, store: ObjectStore) -> CompactionResult:
    spec, group = unit.store, unit.group
    reader = ObjectReader(store, spec.namespace, BlockCache(0))
    indexes = await asyncio.gather(
        *(reader.index(so.object_id, so.object_size) for so in group.sources)
    )
    data_sizes = [max((e.end_position for e in index), default=0) for index in indexes]
    copied = all(size >= MIN_PART_SIZE for size in data_sizes)
    upload = store.upload(spec.key(unit.object_id))
    read_bytes = 0
    try:
        if copied:
            merged: list[DataBlockIndex] = []
            position = 0
            for so, index, size in zip(group.sources, indexes, data_sizes, strict=True):
                await upload.copy(spec.key(so.object_id), 0, size)
                merged += [
                    dataclasses.replace(e, start_position=e.start_position + position)
                    for e in index
                ]
                position += size
            index_block = object_format.encode_index(merged)
            await upload.write(
                [index_block, object_format.encode_footer(Footer(position, len(index_block)))]
            )
        else:
            writer = ObjectWriter(spec.block_size)
            for so, size in zip(group.sources, data_sizes, strict=True):
                data = await _get_exact(store, spec.key(so.object_id), 0, size)
                read_bytes += len(data)
                pos = 0
                while pos < size:
                    batches, pos = object_format.decode_block(data, pos)
                    writer.add_all(batches)
                    await upload.write(writer.drain())
            built = writer.finish()
            await upload.write(built.parts)
        object_size = await upload.finish()
    except BaseException:
        await _discard(store, [upload], [])
        raise
    return CompactionResult(
        object_id=unit.object_id,
        object_size=object_size,
        ranges=(),
        stream_objects=(),
        keys=(upload.key,),
        read_bytes=read_bytes,
        written_bytes=object_size,
        copied=copied,
    )


# -- listing and deleting ----------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ListUnit:
    store: StoreSpec
    prefixes: tuple[str, ...]


def list_keys(unit: ListUnit) -> list[ObjectInfo]:
    """Every key under the unit's prefixes (listed concurrently) in this cluster's namespace."""
    marker = f"/{unit.store.namespace}/"

    async def body(store: ObjectStore) -> list[ObjectInfo]:
        async def one(prefix: str) -> list[ObjectInfo]:
            return [info async for info in store.list(prefix) if marker in info.key]

        parts = await asyncio.gather(*(one(p) for p in unit.prefixes))
        return [info for part in parts for info in part]

    return _run(unit.store, body)[0]


@dataclass(slots=True, frozen=True)
class DeleteUnit:
    store: StoreSpec
    keys: tuple[str, ...]


def delete_keys(unit: DeleteUnit) -> int:
    """Delete the keys (missing ones are ignored); return how many were asked for."""

    async def body(store: ObjectStore) -> int:
        await store.delete(list(unit.keys))
        return len(unit.keys)

    return _run(unit.store, body)[0]
