"""Compaction units against the real S3 server: what they write reads back byte-identical."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from storage.block_cache import BlockCache
from storage.compaction.analyzer import SourceObject, plan_compaction
from storage.compaction.stream_objects import StreamObjectGroup
from storage.compaction.units import (
    DeleteUnit,
    IndexReadUnit,
    ListUnit,
    SOCompactionUnit,
    SSOCompactionUnit,
    StoreSpec,
    compact_stream_objects,
    compact_stream_set_objects,
    delete_keys,
    list_keys,
    read_indexes,
)
from storage.metadata.model import StreamObject
from storage.object_reader import ObjectReader
from storage.object_writer import ObjectWriter
from storage.stream_record_batch import StreamRecordBatch
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def spec(s3_server: SeaweedFS) -> StoreSpec:
    return StoreSpec(
        url=s3_server.url(),
        namespace=f"_kafka_u{uuid.uuid4().hex[:10]}",
        part_size=5 * MiB,
        block_size=64 << 10,
    )


def batch(stream: int, offset: int, size: int) -> StreamRecordBatch:
    return StreamRecordBatch(stream, 0, offset, 1, os.urandom(size))


def put_object(spec: StoreSpec, object_id: int, batches: list[StreamRecordBatch]) -> int:
    writer = ObjectWriter(spec.block_size)
    writer.add_all(sorted(batches, key=lambda b: (b.stream_id, b.base_offset)))
    built = writer.finish()

    async def put() -> None:
        store = spec.open()
        try:
            await store.put(spec.key(object_id), built.parts)
        finally:
            await store.close()

    asyncio.run(put())
    return built.size


def read_stream(spec: StoreSpec, objects: list[tuple[int, int]], stream: int) -> list[bytes]:
    """Every batch of ``stream`` in the given objects (in order), as payload bytes."""

    async def read() -> list[bytes]:
        store = spec.open()
        try:
            reader = ObjectReader(store, spec.namespace, BlockCache(1 << 30))
            out: list[bytes] = []
            for object_id, size in objects:
                got = await reader.read(object_id, size, stream, 0, -1, 1 << 40)
                out += [bytes(b.payload) for b in got]
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def test_sso_compaction_rewrites_everything_byte_identical(spec: StoreSpec) -> None:
    """Ten small SSOs of five streams (one large) compact, in iterations far smaller than the
    data, into one SSO and Stream Objects holding exactly the same batches."""
    originals: dict[int, list[StreamRecordBatch]] = {s: [] for s in range(5)}
    offsets = dict.fromkeys(range(5), 0)
    sizes = {}
    for object_id in range(10):
        batches = []
        for stream in range(5):
            for _ in range(8 if stream == 2 else 2):
                b = batch(stream, offsets[stream], 20_000 if stream == 2 else 3_000)
                offsets[stream] += 1
                batches.append(b)
                originals[stream].append(b)
        sizes[object_id] = put_object(spec, object_id, batches)
    indexes = read_indexes(IndexReadUnit(spec, tuple(sizes.items())))
    sources = [SourceObject(i, sizes[i], i, 0, indexes[i]) for i in range(10)]
    plan = plan_compaction(
        sources, dict.fromkeys(range(5), 0), split_size=1 * MiB, cache_size=256 << 10
    )
    assert plan is not None and len(plan.iterations) >= 4

    result = compact_stream_set_objects(SSOCompactionUnit(spec, plan, 100, {2: 7}))

    assert result.object_id == 100
    assert [(so.stream_id, so.start_offset, so.end_offset) for so in result.stream_objects] == [
        (2, 0, 80)
    ] or all(so.stream_id == 2 for so in result.stream_objects)
    assert {r.stream_id for r in result.ranges} == {0, 1, 3, 4}
    assert result.requests["get"] == plan.get_count
    new_objects = [(100, result.object_size)] + [
        (so.object_id, so.object_size) for so in result.stream_objects
    ]
    for stream in range(5):
        want = [bytes(b.payload) for b in originals[stream]]
        assert read_stream(spec, new_objects, stream) == want, f"stream {stream}"
    epochs = {r.stream_id: r.epoch for r in result.ranges}
    assert epochs == dict.fromkeys((0, 1, 3, 4), 0)
    assert len(list_keys(ListUnit(spec, ("",)))) == 10 + 1 + len(result.stream_objects)


def test_blocks_cut_at_a_start_offset_lose_the_batches_below_it(spec: StoreSpec) -> None:
    """One earlier compaction left each stream in one block; their starts moved into those
    blocks. The rewrite keeps exactly the batches that end above each start, in the SSO and in
    a Stream Object (whose start offset is its first kept batch's)."""
    small = [batch(0, o, 2_000) for o in range(20)]
    large = [batch(1, o, 50_000) for o in range(20)]
    size = put_object(spec, 0, small + large)
    other = put_object(spec, 1, [batch(0, 20, 2_000)])
    indexes = read_indexes(IndexReadUnit(spec, ((0, size), (1, other))))
    assert len([b for b in indexes[0] if b.stream_id == 0]) == 1  # one block holds stream 0
    sources = [SourceObject(0, size, 0, 0, indexes[0]), SourceObject(1, other, 1, 0, indexes[1])]
    plan = plan_compaction(sources, {0: 12, 1: 5}, split_size=256 << 10, cache_size=4 * MiB)
    assert plan is not None and plan.start_offsets == {0: 12, 1: 5}

    result = compact_stream_set_objects(SSOCompactionUnit(spec, plan, 100))

    assert [(r.stream_id, r.start_offset, r.end_offset) for r in result.ranges] == [(0, 12, 21)]
    assert [(so.stream_id, so.start_offset, so.end_offset) for so in result.stream_objects] == [
        (1, 5, 20)
    ]
    assert read_stream(spec, [(100, result.object_size)], 0) == [
        bytes(b.payload) for b in small[12:]
    ] + [read_stream(spec, [(1, other)], 0)[0]]
    so = result.stream_objects[0]
    assert read_stream(spec, [(so.object_id, so.object_size)], 1) == [
        bytes(b.payload) for b in large[5:]
    ]
    assert result.read_bytes > result.written_bytes  # the cut batches were read, not written


@pytest.mark.parametrize("large", [True, False])
def test_so_compaction_copies_large_sources_and_rewrites_small_ones(
    spec: StoreSpec, large: bool
) -> None:
    size = 6 * MiB if large else 200_000
    sources = []
    payloads = []
    offset = 0
    for object_id in range(3):
        batches = [batch(9, offset + i, size // 8) for i in range(8)]
        offset += 8
        payloads += [bytes(b.payload) for b in batches]
        object_size = put_object(spec, object_id, batches)
        sources.append(StreamObject(object_id, 9, offset - 8, offset, object_size))
    group = StreamObjectGroup(9, 0, tuple(sources))

    result = compact_stream_objects(SOCompactionUnit(spec, group, 50))

    assert result.copied is large
    if large:  # UploadPartCopy only: no source byte downloaded beyond the tails with indexes
        assert result.requests["part_copy"] == 3 and result.read_bytes == 0
    assert read_stream(spec, [(50, result.object_size)], 9) == payloads
    assert delete_keys(DeleteUnit(spec, result.keys)) == 1
    assert [i.key for i in list_keys(ListUnit(spec, ("",)))] == sorted(
        spec.key(i) for i in range(3)
    )


def test_failed_compaction_leaves_no_object(spec: StoreSpec) -> None:
    sizes = {i: put_object(spec, i, [batch(1, i, 1000)]) for i in range(2)}
    indexes = read_indexes(IndexReadUnit(spec, tuple(sizes.items())))
    sources = [SourceObject(i, sizes[i], i, 0, indexes[i]) for i in range(2)]
    plan = plan_compaction(sources, {1: 0}, split_size=MiB, cache_size=MiB)
    assert plan is not None
    asyncio.run(_delete(spec, spec.key(1)))  # a source vanishes mid-way

    with pytest.raises(Exception, match=r"truncated|not found|NoSuchKey"):
        compact_stream_set_objects(SSOCompactionUnit(spec, plan, 100))

    assert [i.key for i in list_keys(ListUnit(spec, ("",)))] == [spec.key(0)]


async def _delete(spec: StoreSpec, key: str) -> None:
    store = spec.open()
    try:
        await store.delete([key])
    finally:
        await store.close()
