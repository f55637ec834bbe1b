"""The PostgreSQL record log: brokers sharing one database see each other's changes, a change
checked against a stale image is checked again, snapshots bound the log, outages are survived.

The checks every backend shares run against PostgreSQL through the ``manager`` fixture; these
are the ones only a shared store has.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import asyncpg
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.metadata import postgres_store, record_codec
from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.model import ErrorCode, MetadataError
from storage.metadata.postgres_store import SchemaVersionError
from storage.metadata.records import KVRecord, Record
from storage.metadata.store import MetadataFailedError, MetadataUnavailableError
from tests.storage.metadata.helpers import (
    NEWER_VERSION_ENTRY,
    TTL_MS,
    FakeClock,
    append_raw,
    build_everything,
    open_new_stream,
)
from tests.support.postgres import PostgresServer


@pytest.fixture
async def pair(postgres_url: str) -> AsyncIterator[tuple[MetadataManager, MetadataManager]]:
    """Two brokers' metadata managers on one database."""
    a = await MetadataManager.open(postgres_url)
    b = await MetadataManager.open(postgres_url)
    yield a, b
    await a.close()
    await b.close()


async def _eventually(check: Callable[[], bool], timeout: float = 5.0) -> float:
    """Seconds until ``check()`` held."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "condition never held"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def test_a_change_reaches_the_other_broker_within_milliseconds(
    pair: tuple[MetadataManager, MetadataManager],
) -> None:
    a, b = pair
    delays = []
    for i in range(20):
        await a.put_kv(f"k/{i}", b"v")
        delays.append(await _eventually(lambda i=i: b.get_kv(f"k/{i}") == b"v"))
    delays.sort()
    assert delays[len(delays) // 2] < 0.1, delays  # the notification, not the 5 s poll
    assert b.image == a.image


async def test_listeners_hear_their_own_and_the_others_changes(
    pair: tuple[MetadataManager, MetadataManager],
) -> None:
    a, b = pair
    heard: list[str] = []
    b.add_listener(lambda records: heard.extend(getattr(r, "key", "?") for r in records))
    await b.put_kv("mine", b"1")
    await a.put_kv("theirs", b"2")
    await _eventually(lambda: "theirs" in heard)
    assert heard == ["mine", "theirs"]


async def test_concurrent_changes_are_all_kept_in_one_order(
    pair: tuple[MetadataManager, MetadataManager],
) -> None:
    """Both brokers create streams at once: every id handed out once, both images equal."""
    a, b = pair
    ea = await a.register_node(1)
    eb = await b.register_node(2)

    async def create(m: MetadataManager, node: int, epoch: int) -> list[int]:
        return [await m.create_stream(node, epoch) for _ in range(30)]

    ids_a, ids_b = await asyncio.gather(create(a, 1, ea), create(b, 2, eb))
    assert len(set(ids_a) | set(ids_b)) == 60
    await a.catch_up()
    await b.catch_up()
    assert a.image == b.image
    assert sorted(a.image.streams) == sorted(ids_a + ids_b)


async def test_a_change_checked_against_a_stale_image_is_checked_again(
    pair: tuple[MetadataManager, MetadataManager],
) -> None:
    """Broker b takes a stream over; broker a, not yet told, is still refused: the store makes
    it catch up and check again, so a zombie owner can never commit."""
    a, b = pair
    ea = await a.register_node(1)
    sid = await open_new_stream(a, 1, ea)
    await _eventually(lambda: b.stream(sid) is not None)
    eb = await b.register_node(2)
    # keep a's image stale: its follower is not running
    assert a._follower is not None
    a._follower.cancel()
    await b.open_stream(2, eb, sid, 1)
    assert a.stream(sid).epoch == 0  # a has not heard
    with pytest.raises(MetadataError) as refused:
        await a.close_stream(1, ea, sid, 0)
    assert refused.value.code is ErrorCode.STREAM_FENCED
    assert a.stream(sid).epoch == 1  # it caught up on the way


async def test_a_broker_that_starts_later_replays_the_log(postgres_url: str) -> None:
    clock = FakeClock()
    first = await MetadataManager.open(postgres_url, clock=clock)
    await build_everything(first, clock)
    later = await MetadataManager.open(postgres_url, clock=clock)
    try:
        assert later.image == first.image
        # counters continue across brokers
        next_id = max(first.image.objects) + 1
        assert await later.prepare_object(1, TTL_MS) == next_id
    finally:
        await first.close()
        await later.close()


async def test_snapshots_bound_the_log_and_a_lagging_broker_reloads(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_store, "SNAPSHOT_INTERVAL", 10)
    a = await MetadataManager.open(postgres_url)
    lagging = await MetadataManager.open(postgres_url)
    assert lagging._follower is not None
    lagging._follower.cancel()  # frozen: it hears nothing while the log is trimmed
    try:
        for i in range(45):
            await a.put_kv(f"k/{i}", str(i).encode())
        conn = await asyncpg.connect(postgres_url)
        try:
            rows = await conn.fetch("SELECT log_offset FROM metadata_snapshots")
            snapshots = [r[0] for r in rows]
            first_kept = await conn.fetchval("SELECT min(log_offset) FROM metadata_log")
        finally:
            await conn.close()
        assert sorted(snapshots) == [30, 40]  # the newest two
        assert first_kept == 31  # entries before the older snapshot are dropped

        fresh = await MetadataManager.open(postgres_url)
        try:
            assert fresh.image == a.image
        finally:
            await fresh.close()
        await lagging.put_kv("late", b"x")  # its entry 1 is gone: it reloads and goes on
        await a.catch_up()
        assert lagging.image == a.image
        assert a.get_kv("late") == b"x"
    finally:
        await a.close()
        await lagging.close()


async def _lagging(url: str) -> MetadataManager:
    """A manager whose follower is stopped: it hears of others' changes only when asked."""
    manager = await MetadataManager.open(url)
    assert manager._follower is not None
    manager._follower.cancel()
    return manager


async def test_a_snapshot_written_by_a_catching_up_broker_holds_every_entry_before_it(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker catching up on several entries at once writes its snapshot once its image holds
    all of them, not after the first (labelled with the last one's offset, it would drop the
    others from every image loaded from it)."""
    monkeypatch.setattr(postgres_store, "SNAPSHOT_INTERVAL", 3)
    a = await MetadataManager.open(postgres_url)
    b = await _lagging(postgres_url)
    try:
        for i in range(5):
            await a.put_kv(f"k/{i}", b"v")
        await b.catch_up()  # five entries at once: b writes a snapshot of them
        fresh = await MetadataManager.open(postgres_url)
        try:
            assert fresh.image == a.image
        finally:
            await fresh.close()
    finally:
        await a.close()
        await b.close()


async def test_a_reload_that_fails_midway_leaves_the_image_where_it_was(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store away while a lagging broker loads the newest snapshot and the entries after
    it: its next catch-up starts from its own image again, not from the snapshot it never got."""
    monkeypatch.setattr(postgres_store, "SNAPSHOT_INTERVAL", 3)
    a = await MetadataManager.open(postgres_url)
    lagging = await _lagging(postgres_url)
    store = lagging._store
    assert isinstance(store, postgres_store.PostgresStore)
    try:
        for i in range(10):
            await a.put_kv(f"k/{i}", b"v")
        real = store._entries_after

        async def cut_off(conn: asyncpg.Connection, offset: int, **kwargs: object) -> object:
            if offset > 0:  # the load's read, after the snapshot's
                raise OSError("injected: the connection dropped")
            return await real(conn, offset, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "_entries_after", cut_off)
        with pytest.raises(MetadataUnavailableError):
            await lagging.catch_up()  # entry 1 is gone: it reloads, and the reload fails
        monkeypatch.setattr(store, "_entries_after", real)
        await lagging.catch_up()
        assert lagging.image == a.image
    finally:
        await a.close()
        await lagging.close()


async def test_a_reload_after_a_failed_apply_tells_the_listeners(
    pair: tuple[MetadataManager, MetadataManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry the image could not apply is read again with the whole image: what listeners
    derive from the image (leaders, topics, configs) is rebuilt too, and a listener that fails
    on the reload does not keep the others from hearing of it."""
    a, _ = pair
    heard: list[list[str]] = []

    def broken(records: Sequence[Record]) -> None:
        if not records:
            raise RuntimeError("injected: a listener fails on a reload")

    a.add_listener(broken)
    a.add_listener(lambda records: heard.append([getattr(r, "key", "?") for r in records]))
    real = MetadataImage.apply

    def apply_failing_once(image: MetadataImage, records: Sequence[Record]) -> None:
        if any(getattr(r, "key", None) == "boom" for r in records):
            monkeypatch.setattr(MetadataImage, "apply", real)
            raise RuntimeError("injected: the image could not apply the entry")
        real(image, records)

    monkeypatch.setattr(MetadataImage, "apply", apply_failing_once)
    with pytest.raises(RuntimeError, match="could not apply"):
        await a.change(lambda image: ([KVRecord("topic", b"t"), KVRecord("boom", b"")], None))
    assert a.get_kv("topic") == b"t"  # the image read anew holds the change
    assert heard == [[]]


async def test_an_unreadable_snapshot_stops_a_broker_that_reloads(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_store, "SNAPSHOT_INTERVAL", 3)
    a = await MetadataManager.open(postgres_url)
    lagging = await _lagging(postgres_url)
    try:
        for i in range(10):
            await a.put_kv(f"k/{i}", b"v")
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(
                "UPDATE metadata_snapshots SET image = $1 WHERE log_offset = "
                "(SELECT max(log_offset) FROM metadata_snapshots)",
                b"\xc1",
            )
        finally:
            await conn.close()
        with pytest.raises(MetadataFailedError, match="metadata snapshot at entry"):
            await lagging.catch_up()
        assert isinstance(lagging.failed, record_codec.UnreadableEntryError)
    finally:
        await a.close()
        await lagging.close()


async def test_an_outage_fails_changes_not_reads_and_heals_by_itself() -> None:
    with PostgresServer() as server:
        url = server.create_database()
        a = await MetadataManager.open(url)
        b = await MetadataManager.open(url)
        try:
            await a.put_kv("before", b"1")
            await _eventually(lambda: b.get_kv("before") == b"1")
            server.pause()
            with pytest.raises(MetadataUnavailableError, match="unreachable"):
                await a.put_kv("during", b"2")
            assert a.get_kv("before") == b"1"  # reads go on from the image
            server.resume()
            await a.put_kv("after", b"3")  # a new connection, no restart
            await _eventually(lambda: b.get_kv("after") == b"3", timeout=15)
            assert b.image == a.image
        finally:
            await a.close()
            await b.close()


async def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    m = await MetadataManager.open(postgres_url)
    await m.close()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("UPDATE automq_schema SET version = 99")
    finally:
        await conn.close()
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        await MetadataManager.open(postgres_url)


async def test_an_entry_this_version_cannot_read_stops_its_metadata_not_its_reads(
    pair: tuple[MetadataManager, MetadataManager], postgres_url: str
) -> None:
    a, b = pair
    heard: list[BaseException] = []
    b.add_failure_listener(heard.append)
    await a.put_kv("before", b"1")
    await _eventually(lambda: b.get_kv("before") == b"1")
    offset = await append_raw(postgres_url, NEWER_VERSION_ENTRY)
    await _eventually(lambda: b.failed is not None)
    assert isinstance(b.failed, record_codec.UnknownRecordError)
    assert f"metadata log entry {offset}: unknown metadata record tag 99" in str(b.failed)
    await asyncio.sleep(0.05)
    assert heard == [b.failed]  # told once, not at every announcement after it
    with pytest.raises(MetadataFailedError, match="tag 99"):
        await b.put_kv("after", b"2")
    assert b.get_kv("before") == b"1"  # reads go on from the image
    # the other broker's next change meets the entry too, as does a broker starting now
    with pytest.raises(MetadataFailedError, match="tag 99"):
        await a.put_kv("after", b"2")
    assert isinstance(a.failed, record_codec.UnknownRecordError)
    with pytest.raises(record_codec.UnknownRecordError, match=f"entry {offset}: unknown"):
        await MetadataManager.open(postgres_url)


async def test_a_catch_up_that_fails_midway_reads_its_entries_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_store, "CATCH_UP_BATCH", 2)
    writer = await postgres_store.PostgresStore.open(postgres_url)
    reader = await postgres_store.PostgresStore.open(postgres_url)
    try:
        await writer.load()
        await reader.load()
        for i in range(3):
            await writer.persist([KVRecord(f"k{i}", b"v")])
        damaged = await append_raw(postgres_url, b"\xc1")  # never valid msgpack
        with pytest.raises(record_codec.UnreadableEntryError):
            await reader.catch_up()  # its first batch of two was read before the error
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(
                "UPDATE metadata_log SET records = $1 WHERE log_offset = $2",
                record_codec.encode([KVRecord("k3", b"v")]),
                damaged,
            )
        finally:
            await conn.close()
        entries = await reader.catch_up()
        assert [e[0].key for e in entries] == ["k0", "k1", "k2", "k3"]  # type: ignore[attr-defined]
    finally:
        await writer.close()
        await reader.close()


async def test_an_unreachable_store_at_start_names_the_url(postgres_server: PostgresServer) -> None:
    url = f"postgresql://automq:secret@127.0.0.1:{postgres_server.port + 1}/nowhere"
    with pytest.raises(MetadataUnavailableError) as e:
        await MetadataManager.open(url)
    assert "127.0.0.1" in str(e.value) and "secret" not in str(e.value)


async def test_snapshot_records_rebuild_the_image() -> None:
    clock = FakeClock()
    m = await MetadataManager.open("sqlite://:memory:", clock=clock)
    try:
        await build_everything(m, clock)
        rebuilt = MetadataImage()
        rebuilt.apply(record_codec.decode(record_codec.encode(record_codec.image_records(m.image))))
        assert rebuilt == m.image
    finally:
        await m.close()


@given(st.binary(max_size=200))
def test_decoding_garbage_raises_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        record_codec.decode(data)


@given(
    st.lists(
        st.lists(
            st.one_of(st.integers(-5, 20), st.text(max_size=3), st.binary(max_size=3), st.none()),
            max_size=8,
        ),
        max_size=4,
    )
)
def test_decoding_ill_typed_records_raises_value_error(items: list[list[object]]) -> None:
    try:
        records = record_codec.decode(msgpack.packb(items, use_bin_type=True))
    except ValueError:
        return
    # whatever decoded is well-formed: it encodes back to the same bytes
    assert record_codec.decode(record_codec.encode(records)) == records


def test_a_record_whose_tag_is_a_boolean_is_refused() -> None:
    with pytest.raises(ValueError):
        record_codec.decode(msgpack.packb([[True, 1, 1, 1, 0, 0]]))
