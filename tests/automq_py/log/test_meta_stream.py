"""MetaStream: key-value replay and compaction over a real stream."""

from __future__ import annotations

import asyncio

import pytest

from automq_py.log import meta_stream_record
from automq_py.log.meta_stream import MetaStream
from automq_py.log.meta_stream_record import MetaKeyValue
from storage.stream import StreamClient
from tests.automq_py.log.conftest import StorageFactory


async def test_replay_keeps_the_last_value_per_key(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    stream = await client.create_and_open()
    meta = MetaStream(stream)
    await meta.put("PARTITION", b"a")
    await meta.put("LOG", b"b")
    await meta.put("PARTITION", b"c")
    assert meta.get("PARTITION") == b"c" and meta.get("missing") is None
    assert meta.superseded_records == 1
    # a record written by AutoMQ in another way: raw bytes, then garbage that is skipped
    await stream.append(meta_stream_record.encode(MetaKeyValue("LEADER_EPOCH_CHECKPOINT", b"")), 1)
    await stream.append(b"\x07not a record", 1)
    replayed = MetaStream(stream)
    assert await replayed.replay() == {
        "PARTITION": b"c",
        "LOG": b"b",
        "LEADER_EPOCH_CHECKPOINT": b"",
    }
    assert replayed.superseded_records == 1


async def test_compaction_trims_superseded_records(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    stream = await client.create_and_open()
    meta = MetaStream(stream, compaction_threshold=10)
    await meta.put("A", b"first")
    for i in range(12):
        await meta.put("B", str(i).encode())
    # B10 (offset 11) was the tenth superseded record: the copies of A and B start at 12
    assert stream.start_offset == 12
    assert meta.superseded_records == 1  # B11 replaced B10's copy
    await meta.put("A", b"last")
    await meta.compact()
    assert stream.start_offset == 16 and stream.next_offset == 18
    again = MetaStream(await client.open(stream.stream_id, 1))
    assert await again.replay() == {"A": b"last", "B": b"11"}
    assert again.superseded_records == 0


async def test_close_compacts_then_closes(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    meta = MetaStream(await client.create_and_open())
    for i in range(5):
        await meta.put("K", bytes([i]))
    await meta.close()
    reopened = MetaStream(await client.open(meta.stream_id, 0))
    assert reopened.stream.start_offset == 5
    assert await reopened.replay() == {"K": b"\x04"}


async def test_several_records_are_written_together_in_order(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    stream = await client.create_and_open()
    meta = MetaStream(stream)
    await meta.put("PARTITION", b"a")
    commits = storage.wal.stats.fsyncs
    await meta.put_many([("PARTITION", b"b"), ("LOG", b"c"), ("LEADER_EPOCH_CHECKPOINT", b"d")])
    assert storage.wal.stats.fsyncs == commits + 1  # one durable write for the three
    # a value a key already holds is not written again
    await meta.put_many([("LOG", b"c"), ("PARTITION", b"e")])
    assert stream.next_offset == 5
    assert (meta.get("PARTITION"), meta.superseded_records) == (b"e", 2)
    replayed = MetaStream(stream)
    assert await replayed.replay() == {
        "PARTITION": b"e",
        "LOG": b"c",
        "LEADER_EPOCH_CHECKPOINT": b"d",
    }
    assert replayed.superseded_records == 2


async def test_a_write_whose_caller_is_cancelled_stays_the_value(
    make_storage: StorageFactory,
) -> None:
    """A caller cancelled while its record waits for the WAL leaves the record in the stream:
    the value is the MetaStream's from its append, so a later compaction copies it, not the
    value it replaced (which, copied after it, would win the next replay)."""
    storage = await make_storage()
    client = StreamClient(storage)
    stream = await client.create_and_open()
    meta = MetaStream(stream, compaction_threshold=3)
    await meta.put("LOG", b"old")
    writer = asyncio.create_task(meta.put("LOG", b"new"))
    await asyncio.sleep(0)  # appended, waiting for its WAL write
    assert not writer.done() and stream.next_offset == 2
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert meta.get("LOG") == b"new"
    for i in range(3):  # the third superseded record compacts the stream
        await meta.put("EPOCHS", bytes([i]))
    assert meta.superseded_records == 0 and stream.start_offset == 5
    assert await MetaStream(stream).replay() == {"LOG": b"new", "EPOCHS": b"\x02"}
    # the same value again: nothing written, durable when the put returns
    written = stream.next_offset
    await meta.put("LOG", b"new")
    assert stream.next_offset == written
