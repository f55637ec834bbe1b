"""Seed 001's object lookup: Stream Objects first, then ranges -> node -> Stream Set Objects."""

from __future__ import annotations

import pytest

from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    NodeMetadata,
    RangeMetadata,
    S3ObjectMetadata,
    S3ObjectType,
    StreamMetadata,
    StreamObject,
    StreamSetObject,
    StreamState,
)
from storage.object_format import StreamOffsetRange
from tests.storage.metadata.helpers import open_new_stream, write_so, write_sso

SO = S3ObjectType.STREAM
SSO = S3ObjectType.STREAM_SET


@pytest.fixture
async def mixed(manager: MetadataManager) -> tuple[MetadataManager, int, list[int]]:
    """SO [0,100); node 1 SSO [100,150); reopened on node 2: SSO [150,200); SO [200,300)."""
    e1 = await manager.register_node(1)
    e2 = await manager.register_node(2)
    sid = await open_new_stream(manager, 1, e1)
    noise = await open_new_stream(manager, 1, e1)
    so1 = await write_so(manager, 1, e1, sid, 0, 100, size=11)
    sso1 = await write_sso(manager, 1, e1, [(noise, 0, 0, 7), (sid, 0, 100, 150)], size=22)
    await manager.open_stream(2, e2, sid, 1)
    sso2 = await write_sso(manager, 2, e2, [(sid, 1, 150, 200)], size=33)
    so2 = await write_so(manager, 2, e2, sid, 200, 300, size=44)
    return manager, sid, [so1, sso1, sso2, so2]


async def test_whole_stream(mixed: tuple[MetadataManager, int, list[int]]) -> None:
    m, sid, (so1, sso1, sso2, so2) = mixed
    assert m.get_objects(sid, 0, -1, 10) == [
        S3ObjectMetadata(so1, 11, SO, 0, 100),
        S3ObjectMetadata(sso1, 22, SSO, 100, 150),
        S3ObjectMetadata(sso2, 33, SSO, 150, 200),
        S3ObjectMetadata(so2, 44, SO, 200, 300),
    ]


async def test_from_the_middle_of_an_object(mixed: tuple[MetadataManager, int, list[int]]) -> None:
    m, sid, (_so1, sso1, sso2, so2) = mixed
    assert [o.object_id for o in m.get_objects(sid, 120, 250, 10)] == [sso1, sso2, so2]
    assert [o.object_id for o in m.get_objects(sid, 150, 151, 10)] == [sso2]
    assert [o.object_id for o in m.get_objects(sid, 299, -1, 10)] == [so2]


async def test_limit(mixed: tuple[MetadataManager, int, list[int]]) -> None:
    m, sid, (so1, sso1, _sso2, _so2) = mixed
    assert [o.object_id for o in m.get_objects(sid, 0, -1, 2)] == [so1, sso1]
    assert [o.object_id for o in m.get_objects(sid, 0, -1, 1)] == [so1]
    with pytest.raises(ValueError):
        m.get_objects(sid, 0, -1, 0)


async def test_nothing_at_or_past_the_end(mixed: tuple[MetadataManager, int, list[int]]) -> None:
    m, sid, objects = mixed
    assert m.get_objects(sid, 300, -1, 10) == []
    assert [o.object_id for o in m.get_objects(sid, 0, 1000, 10)] == objects
    assert m.get_objects(12345, 0, -1, 10) == []


async def test_after_compaction_into_one_stream_object(
    mixed: tuple[MetadataManager, int, list[int]],
) -> None:
    m, sid, (so1, _sso1, _sso2, so2) = mixed
    new = await m.prepare_object(1, 1000)
    await m.commit_stream_object(new, sid, 1, 200, 300, 44, [so2])
    await m.commit_stream_object(await m.prepare_object(1, 1000), sid, 1, 0, 100, 11, [so1])
    result = m.get_objects(sid, 0, -1, 10)
    assert [(o.object_type, o.start_offset, o.end_offset) for o in result] == [
        (SO, 0, 100),
        (SSO, 100, 150),
        (SSO, 150, 200),
        (SO, 200, 300),
    ]


def _image(
    sos: tuple[StreamObject, ...],
    ranges: tuple[RangeMetadata, ...],
    ssos: tuple[StreamSetObject, ...],
) -> MetadataImage:
    end = max([r.end_offset for r in ranges] or [0])
    stream = StreamMetadata(7, 1, StreamState.OPENED, 0, end, ranges, sos)
    nodes = {
        n: NodeMetadata(n, 1, False, tuple(s for s in ssos if s.node_id == n))
        for n in {r.node_id for r in ranges}
    }
    return MetadataImage(streams={7: stream}, nodes=nodes)


def test_a_gap_gives_a_partial_answer() -> None:
    # [0,10) in an SO, [10,20) lost (e.g. metadata not caught up), [20,30) in an SSO
    image = _image(
        (StreamObject(1, 7, 0, 10, 1),),
        (RangeMetadata(7, 0, 0, 0, 30, 1),),
        (StreamSetObject(2, 1, 2, 0, 1, (StreamOffsetRange(7, 20, 30),)),),
    )
    assert [o.object_id for o in image.get_objects(7, 0, -1, 10)] == [1]
    assert [o.object_id for o in image.get_objects(7, 20, -1, 10)] == [2]


def test_sso_search_follows_order_id_and_skips_other_streams() -> None:
    image = _image(
        (),
        (RangeMetadata(7, 0, 0, 0, 30, 1),),
        (
            StreamSetObject(
                5, 1, 1, 0, 1, (StreamOffsetRange(3, 0, 100), StreamOffsetRange(7, 0, 10))
            ),
            StreamSetObject(
                6, 1, 2, 0, 1, (StreamOffsetRange(7, 10, 15), StreamOffsetRange(9, 0, 1))
            ),
            # compaction output: two ranges of the stream in one object
            StreamSetObject(
                4, 1, 3, 0, 1, (StreamOffsetRange(7, 15, 20), StreamOffsetRange(7, 25, 30))
            ),
            StreamSetObject(8, 1, 4, 0, 1, (StreamOffsetRange(7, 20, 25),)),
        ),
    )
    assert [(o.object_id, o.start_offset) for o in image.get_objects(7, 0, -1, 10)] == [
        (5, 0),
        (6, 10),
        (4, 15),
        (8, 20),
        (4, 25),
    ]


def test_empty_ranges_left_by_opens_without_writes() -> None:
    image = _image(
        (),
        (
            RangeMetadata(7, 0, 0, 0, 10, 1),
            RangeMetadata(7, 1, 1, 10, 10, 2),
            RangeMetadata(7, 2, 2, 10, 20, 3),
        ),
        (
            StreamSetObject(1, 1, 1, 0, 1, (StreamOffsetRange(7, 0, 10),)),
            StreamSetObject(2, 3, 2, 0, 1, (StreamOffsetRange(7, 10, 20),)),
        ),
    )
    assert [o.object_id for o in image.get_objects(7, 0, -1, 10)] == [1, 2]
