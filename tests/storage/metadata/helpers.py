"""Small builders shared by the metadata tests: a settable clock and one-call writes."""

from __future__ import annotations

import copy
from collections.abc import Awaitable

import pytest

from storage.metadata.manager import MetadataManager
from storage.metadata.model import CommitRange, CommitStreamObject, ErrorCode, MetadataError

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
