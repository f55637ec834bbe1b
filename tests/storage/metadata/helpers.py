"""Small builders shared by the metadata tests: a settable clock and one-call writes."""

from __future__ import annotations

import copy
from collections.abc import Awaitable

import asyncpg
import msgpack
import pytest

from storage.metadata import postgres_store
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
    ObjectState,
    StreamOffsetRange,
)

TTL_MS = 60_000


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


async def open_new_stream(m: MetadataManager, node_id: int, node_epoch: int, epoch: int = 0) -> int:
    stream_id = await m.create_stream(node_id, node_epoch)
    await m.open_stream(node_id, node_epoch, stream_id, epoch)
    return stream_id


async def write_sso(
    m: MetadataManager,
    node_id: int,
    node_epoch: int,
    ranges: list[tuple[int, int, int, int]],
    size: int = 1000,
) -> int:
    """Commit one Stream Set Object holding ``(stream_id, epoch, start, end)`` ranges."""
    object_id = await m.prepare_object(1, TTL_MS)
    await m.commit_stream_set_object(
        node_id,
        node_epoch,
        object_id,
        object_id,
        size,
        [CommitRange(*r) for r in ranges],
        [],
    )
    return object_id


async def write_so(
    m: MetadataManager,
    node_id: int,
    node_epoch: int,
    stream_id: int,
    start: int,
    end: int,
    size: int = 500,
) -> int:
    """Commit one Stream Object (no Stream Set Object) of ``[start, end)``."""
    object_id = await m.prepare_object(1, TTL_MS)
    await m.commit_stream_set_object(
        node_id,
        node_epoch,
        -1,
        -1,
        0,
        [],
        [CommitStreamObject(object_id, stream_id, start, end, size)],
    )
    return object_id


async def assert_refused(m: MetadataManager, code: ErrorCode, op: Awaitable[object]) -> None:
    """``op`` fails with ``code`` and leaves the image (and so the store) as it was."""
    before = copy.deepcopy(m.image)
    with pytest.raises(MetadataError) as raised:
        await op
    assert raised.value.code is code, raised.value
    assert m.image == before


async def build_everything(m: MetadataManager, clock: FakeClock) -> None:
    """Leave at least one row of every kind, and rows that records changed and removed."""
    e1 = await m.register_node(1)
    e1 = await m.register_node(1)
    e2 = await m.register_node(2)
    a = await open_new_stream(m, 1, e1)
    b = await open_new_stream(m, 1, e1)
    c = await open_new_stream(m, 1, e1)
    x = await write_sso(m, 1, e1, [(a, 0, 0, 10), (b, 0, 0, 10), (c, 0, 0, 3)])
    y = await write_sso(m, 1, e1, [(a, 0, 10, 20)])
    so = await write_so(m, 1, e1, a, 20, 30)
    await m.open_stream(2, e2, a, 1)
    await write_sso(m, 2, e2, [(a, 1, 30, 40)])
    first = await m.prepare_object(2, TTL_MS)
    await m.commit_stream_set_object(
        1,
        e1,
        first,
        0,
        77,
        [CommitRange(b, 0, 0, 10)],
        [CommitStreamObject(first + 1, a, 10, 20, 66)],
        [x, y],
    )
    await m.trim_stream(2, e2, a, 1, 25)  # moves a range's start, frees objects
    d = await open_new_stream(m, 1, e1)
    z = await write_sso(m, 1, e1, [(d, 0, 0, 10), (b, 0, 10, 15)])
    await m.open_stream(2, e2, d, 1)
    await write_sso(m, 2, e2, [(d, 1, 10, 20)])
    await m.trim_stream(2, e2, d, 1, 10)  # removes a range, and d's range from SSO z
    await m.close_stream(1, e1, c, 0)
    await m.delete_stream(1, e1, c, 0)
    await m.prepare_object(3, 10)
    clock.now += 20
    expired = await m.expire_prepared()
    await m.mark_destroyed_done(expired[:1])
    await m.commit_stream_object(await m.prepare_object(1, TTL_MS), a, 1, 25, 30, 5, [so])
    await m.put_kv("p/1", b"\x00\x01")
    await m.put_kv("p/2", b"two")
    await m.put_kv("p/2", b"2")
    await m.put_kv("gone", b"x")
    await m.delete_kv("gone")
    await m.prepare_object(1, TTL_MS)  # an upload in flight

    states = {o.state for o in m.image.objects.values()}
    assert states == set(ObjectState) - {ObjectState.DESTROYED}  # destroyed ones are forgotten
    assert m.image.kv == {"p/1": b"\x00\x01", "p/2": b"2"}
    assert [len(n.stream_set_objects) for n in m.image.nodes.values()] == [2, 2]
    assert [sso.ranges for sso in m.image.nodes[1].stream_set_objects if sso.object_id == z] == [
        (StreamOffsetRange(b, 10, 15),)
    ]
    assert [r.range_index for r in m.image.streams[a].ranges] == [0, 1]
    assert [r.range_index for r in m.image.streams[d].ranges] == [1]


# a log entry of a record kind this version does not know, as a newer broker would write one
NEWER_VERSION_ENTRY = msgpack.packb([[99, "from a newer version"]])


async def append_raw(url: str, data: bytes) -> int:
    """Append ``data`` to the PostgreSQL metadata log at ``url`` as the next entry, as a broker
    of another version would, and announce it; its offset."""
    conn = await asyncpg.connect(url)
    try:
        offset: int = await conn.fetchval(
            "INSERT INTO metadata_log (log_offset, records) "
            "SELECT coalesce(max(log_offset), 0) + 1, $1 FROM metadata_log RETURNING log_offset",
            data,
        )
        await conn.execute("SELECT pg_notify($1, $2)", postgres_store.CHANNEL, str(offset))
    finally:
        await conn.close()
    return offset
