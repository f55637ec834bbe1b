"""Key compaction: Kafka's log cleaner rules one by one, then random histories (with and
without transactions) cleaned twice, checked against the original log."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq_py.log.txn_index import AbortedTxn
from protocol import record_batch
from protocol.control_records import build_marker_batch
from protocol.record_batch import RecordBatchHeader
from protocol.records import Compression, Record, RecordInput, build_batch, parse_records
from storage.compaction.key_compaction import (
    AbortedRange,
    CleanedSegment,
    ProducerLastRecord,
    TxnCleaningState,
    build_offset_map,
    clean_batches,
    last_records_of_producers,
)

T0 = 1_700_000_000_000
DAY = 86_400_000
NOW = T0 + 3_600_000

KV = tuple[bytes | None, bytes | None]


@dataclass
class Log:
    """A partition's log as producers write it: batches at consecutive offsets."""

    batches: list[bytes] = field(default_factory=list)
    aborted: list[AbortedTxn] = field(default_factory=list)
    next_offset: int = 0
    sequences: dict[int, int] = field(default_factory=dict)
    open_txns: dict[int, int] = field(default_factory=dict)  # producer -> first offset

    def append(
        self,
        *records: KV,
        pid: int = -1,
        epoch: int = 0,
        txn: bool = False,
        codec: Compression = Compression.NONE,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> int:
        """Append one batch of ``(key, value)`` records; returns its base offset."""
        base = self.next_offset
        seq = self.sequences.get(pid, 0) if pid >= 0 else -1
        inputs = [
            RecordInput(value, key, headers, T0 + base + i)
            for i, (key, value) in enumerate(records)
        ]
        self._add(
            build_batch(
                inputs,
                compression=codec,
                base_offset=base,
                producer_id=pid,
                producer_epoch=epoch if pid >= 0 else -1,
                base_sequence=seq,
                is_transactional=txn,
            )
        )
        if pid >= 0:
            self.sequences[pid] = seq + len(records)
        if txn:
            self.open_txns.setdefault(pid, base)
        return base

    def end_txn(self, pid: int, commit: bool, epoch: int = 0) -> int:
        """Write ``pid``'s COMMIT or ABORT marker; an abort goes into the transaction index."""
        offset = self.next_offset
        self._add(build_marker_batch(commit, pid, epoch, 0, T0 + offset, base_offset=offset))
        first = self.open_txns.pop(pid, None)
        if not commit and first is not None:
            self.aborted.append(AbortedTxn(pid, first, offset, offset + 1))
        return offset

    def _add(self, batch: bytearray) -> None:
        self.batches.append(bytes(batch))
        self.next_offset = record_batch.parse_header(batch).last_offset + 1


def clean(
    batches: Sequence[bytes],
    aborted: Sequence[AbortedTxn] = (),
    *,
    now: int = NOW,
    up_to: int | None = None,
    base: int = 0,
    active: dict[int, ProducerLastRecord] | None = None,
    offset_map: dict[bytes, int] | None = None,
    txn_state: TxnCleaningState | None = None,
) -> CleanedSegment:
    end = record_batch.parse_header(batches[-1]).last_offset + 1
    up_to = end if up_to is None else up_to
    if offset_map is None:
        offset_map = build_offset_map(batches, aborted=aborted, up_to=up_to)
    return clean_batches(
        batches,
        offset_map,
        segment_base=base,
        clean_up_to=up_to,
        aborted=aborted,
        delete_retention_ms=DAY,
        now_ms=now,
        active_producers=last_records_of_producers(batches) if active is None else active,
        txn_state=txn_state,
    )


def data_of(result: CleanedSegment) -> list[bytes]:
    return [b.data for b in result.batches]


def headers_of(result: CleanedSegment) -> list[RecordBatchHeader]:
    return [record_batch.validate_batch(b.data, from_producer=False) for b in result.batches]


def records_of(batches: Sequence[bytes]) -> list[Record]:
    return [r for b in batches for r in parse_records(b)]


def kv(result: CleanedSegment) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every data record kept."""
    return [
        (r.offset, r.key, r.value)
        for b in data_of(result)
        if not record_batch.parse_header(b).is_control
        for r in parse_records(b)
    ]


# -- one rule at a time ----------------------------------------------------------------------


def test_the_last_value_of_each_key_wins() -> None:
    log = Log()
    log.append((b"k1", b"a"), (b"k2", b"b"))
    log.append((b"k1", b"c"))
    log.append((b"k3", b"d"))
    result = clean(log.batches)
    assert kv(result) == [(1, b"k2", b"b"), (2, b"k1", b"c"), (3, b"k3", b"d")]
    assert build_offset_map(log.batches, aborted=(), up_to=4) == {b"k1": 2, b"k2": 1, b"k3": 3}
    assert (result.stats.records_read, result.stats.records_kept) == (4, 3)
    assert result.stats.records_superseded == 1


def test_kept_records_keep_offsets_timestamps_headers_and_the_batch_its_fields() -> None:
    log = Log()
    records = [(b"k1", b"a"), (b"k2", b"b"), (b"k1", b"c"), (b"k3", b"d"), (b"k2", b"e")]
    log.append(*records, pid=5, headers=[("trace", b"t"), ("none", None)])
    log.append((b"k3", b"f"))
    original = parse_records(log.batches[0])
    result = clean(log.batches, active={})
    first = headers_of(result)[0]
    source = record_batch.parse_header(log.batches[0])
    # offsets 0 and 3 go: the first kept record has delta 1, the batch keeps its last offset
    assert parse_records(result.batches[0].data) == [original[2], original[4]]
    assert (first.base_offset, first.last_offset_delta, first.records_count) == (0, 4, 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (5, 0, 0)
    assert first.base_timestamp == original[2].timestamp
    assert first.max_timestamp == original[4].timestamp
    assert first.crc != source.crc and first.delete_horizon_ms is None
    # an untouched batch is copied byte for byte
    assert result.batches[1].data == log.batches[1]


def test_records_from_the_dirty_end_on_are_not_cleaned() -> None:
    log = Log()
    for value in (b"a", b"b", b"c"):
        log.append((b"k", value))
    log.append((None, b"no key"))
    log.append((None, b"no key, beyond"))
    result = clean(log.batches, up_to=4)
    assert build_offset_map(log.batches, aborted=(), up_to=2) == {b"k": 1}
    assert kv(result) == [(2, b"k", b"c"), (4, None, b"no key, beyond")]
    assert result.stats.records_without_key == 1
    partial = clean(log.batches, up_to=2)  # the map stops at 2: offsets 2.. are kept
    assert kv(partial) == [
        (1, b"k", b"b"),
        (2, b"k", b"c"),
        (3, None, b"no key"),
        (4, None, b"no key, beyond"),
    ]


def test_a_tombstone_gets_a_delete_horizon_then_goes_once_it_has_passed() -> None:
    log = Log()
    log.append((b"k1", b"a"))
    log.append((b"k1", None), (b"k2", b"b"))
    log.append((b"k3", b"c"))
    first = clean(log.batches)
    assert kv(first) == [(1, b"k1", None), (2, b"k2", b"b"), (3, b"k3", b"c")]
    header = headers_of(first)[0]
    assert header.delete_horizon_ms == NOW + DAY
    assert header.attributes & record_batch.DELETE_HORIZON_BIT
    assert header.base_timestamp == NOW + DAY
    assert [r.timestamp for r in parse_records(first.batches[0].data)] == [T0 + 1, T0 + 2]
    assert first.stats.tombstones_kept == 1

    # before the horizon: kept as it is, the horizon not moved
    second = clean(data_of(first), now=NOW + DAY - 1)
    assert data_of(second) == data_of(first)
    # at the horizon: the tombstone goes, the batch keeps its horizon for its other record
    third = clean(data_of(second), now=NOW + DAY)
    assert kv(third) == [(2, b"k2", b"b"), (3, b"k3", b"c")]
    assert headers_of(third)[0].delete_horizon_ms == NOW + DAY
    assert third.stats.tombstones_dropped == 1


def test_aborted_transactions_are_dropped_committed_ones_kept() -> None:
    log = Log()
    log.append((b"k1", b"old"))
    log.append((b"k1", b"aborted"), (b"k2", b"aborted"), pid=7, txn=True)
    log.end_txn(7, commit=False)
    log.append((b"k2", b"committed"), pid=8, txn=True)
    log.end_txn(8, commit=True)
    log.append((b"k9", b"last"))
    assert build_offset_map(log.batches, aborted=log.aborted, up_to=7) == {
        b"k1": 0,
        b"k2": 4,
        b"k9": 6,
    }
    result = clean(log.batches, log.aborted, active={})
    assert kv(result) == [(0, b"k1", b"old"), (4, b"k2", b"committed"), (6, b"k9", b"last")]
    assert [h.base_offset for h in headers_of(result) if h.is_control] == [3, 5]
    assert result.aborted_txns == (log.aborted[0],)  # its marker stays, so does its entry
    assert result.stats.records_aborted == 2
    # without the transaction index the aborted records would count as committed
    assert build_offset_map(log.batches, aborted=(), up_to=7)[b"k1"] == 1


def test_a_commit_marker_stays_while_its_data_does_then_until_its_horizon() -> None:
    log = Log()
    log.append((b"k1", b"a"), pid=8, txn=True)
    log.end_txn(8, commit=True)
    log.append((b"k1", b"b"))
    log.append((b"k2", b"c"))
    # round 1: the transaction's only record is superseded, but its batch was read: marker stays
    first = clean(log.batches, active={})
    assert [h.base_offset for h in headers_of(first)] == [1, 2, 3]
    assert headers_of(first)[0].delete_horizon_ms is None
    # round 2: no data of the transaction is left: the marker gets a delete horizon
    second = clean(data_of(first), now=NOW + 10, active={})
    marker = headers_of(second)[0]
    assert (marker.base_offset, marker.is_control) == (1, True)
    assert marker.delete_horizon_ms == NOW + 10 + DAY
    assert second.stats.markers_kept == 1
    # before its horizon it stays; at its horizon it goes and the next batch covers its offset
    assert data_of(clean(data_of(second), now=NOW + 9 + DAY, active={})) == data_of(second)
    third = clean(data_of(second), now=NOW + 10 + DAY, active={})
    assert [(b.base_offset, b.count) for b in third.batches] == [(2, 3), (3, 1)]
    assert third.stats.markers_dropped == 1


def test_an_abort_marker_stays_while_its_transaction_is_read_then_until_its_horizon() -> None:
    log = Log()
    log.append((b"k1", b"x"), pid=7, txn=True)
    log.end_txn(7, commit=False)
    log.append((b"k2", b"c"))
    first = clean(log.batches, log.aborted, active={})
    assert [h.base_offset for h in headers_of(first)] == [1, 2]
    assert headers_of(first)[0].delete_horizon_ms is None
    assert first.aborted_txns == tuple(log.aborted)
    second = clean(data_of(first), log.aborted, now=NOW + 1, active={})
    assert headers_of(second)[0].delete_horizon_ms == NOW + 1 + DAY
    assert second.aborted_txns == ()  # no aborted data left to index
    third = clean(data_of(second), log.aborted, now=NOW + 1 + DAY, active={})
    assert [(b.base_offset, b.count) for b in third.batches] == [(2, 3)]


def test_a_producers_last_batch_stays_empty_to_keep_its_sequence() -> None:
    log = Log()
    log.append((b"k1", b"a"), (b"k1", b"b"), pid=5, codec=Compression.GZIP)
    log.append((b"k1", b"c"))
    log.append((b"k2", b"d"))
    active = last_records_of_producers(log.batches)
    assert active == {5: ProducerLastRecord(1, 0)}
    result = clean(log.batches, active=active)
    empty = headers_of(result)[0]
    source = record_batch.parse_header(log.batches[0])
    assert (empty.records_count, empty.base_offset, empty.last_offset_delta) == (0, 0, 1)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (5, 0, 0)
    assert (empty.compression, empty.base_timestamp) == ("NONE", -1)
    assert empty.max_timestamp == source.max_timestamp
    assert result.stats.empty_batches_kept == 1
    assert parse_records(result.batches[0].data) == []
    # a producer that is no longer active keeps nothing
    assert [b.base_offset for b in clean(log.batches, active={}).batches] == [2, 3]


def test_a_fenced_producers_last_marker_stays_empty() -> None:
    log = Log()
    log.append((b"k1", b"a"), pid=6, txn=True)
    log.end_txn(6, commit=True)
    log.end_txn(6, commit=False, epoch=1)  # InitProducerId bumped the epoch: only a marker
    log.append((b"k1", b"b"))
    log.append((b"k2", b"c"))
    active = last_records_of_producers(log.batches)
    assert active == {6: ProducerLastRecord(None, 1)}
    rounds = [clean(log.batches, active=active)]
    for now in (NOW + 1, NOW + 2 + DAY, NOW + 3 + 2 * DAY):
        rounds.append(clean(data_of(rounds[-1]), now=now, active=active))
    last = headers_of(rounds[-1])
    assert [h.base_offset for h in last] == [2, 3, 4]
    fenced = last[0]
    assert (fenced.is_control, fenced.records_count, fenced.producer_epoch) == (True, 0, 1)


def test_a_segments_last_batch_stays_so_the_segment_keeps_its_end() -> None:
    log = Log()
    log.append((b"k1", b"a"))
    log.append((b"k2", b"a"))
    log.append((b"k1", b"b"))
    log.append((b"k2", b"b"))
    whole_map = build_offset_map(log.batches, aborted=(), up_to=4)
    segment = clean(log.batches[:2], offset_map=whole_map, up_to=4)
    assert (segment.base_offset, segment.end_offset) == (0, 2)
    assert [(b.base_offset, b.count) for b in segment.batches] == [(1, 2)]
    assert headers_of(segment)[0].records_count == 0


def test_holes_are_covered_so_the_stream_stays_contiguous() -> None:
    log = Log()
    log.append((b"a", b"1"), (b"b", b"1"))  # 0-1
    log.append((b"a", b"2"))  # 2
    log.append((b"c", b"1"), (b"b", b"2"), (b"c", b"2"))  # 3-5
    log.append((b"a", b"3"))  # 6
    log.append((b"d", b"1"))  # 7
    result = clean(log.batches)  # batches 0-1 and 2 go; 3-5 keeps c@5 and b@4
    assert [(b.base_offset, b.count) for b in result.batches] == [(3, 6), (6, 1), (7, 1)]
    assert sum(b.count for b in result.batches) == result.end_offset - result.base_offset == 8
    # a segment whose first batch starts after its base (a second cleaning) covers from its base
    again = clean(data_of(result), base=0)
    assert [(b.base_offset, b.count) for b in again.batches] == [(3, 6), (6, 1), (7, 1)]
    # the stream offset of Kafka offset o is o - base, inside the stream batch that holds o
    stream_start = 0
    for batch in again.batches:
        for r in parse_records(batch.data):
            assert stream_start <= r.offset - again.base_offset < stream_start + batch.count
        stream_start += batch.count


@pytest.mark.parametrize("codec", list(Compression))
def test_compressed_batches_keep_their_codec(codec: Compression) -> None:
    log = Log()
    log.append((b"k1", b"a" * 50), (b"k2", b"b" * 50), (b"k3", None), codec=codec)
    log.append((b"k2", b"c"), codec=codec)
    result = clean(log.batches)
    rebuilt = headers_of(result)[0]
    assert rebuilt.compression == codec.name
    assert kv(result) == [(0, b"k1", b"a" * 50), (2, b"k3", None), (3, b"k2", b"c")]
    assert result.batches[1].data == log.batches[1]


def test_groups_of_a_round_pass_the_transaction_state_on() -> None:
    log = Log()
    log.append((b"k1", b"a"), pid=8, txn=True)  # group 1
    log.append((b"k2", b"b"))
    log.end_txn(8, commit=True)  # group 2
    log.append((b"k3", b"c"))
    offset_map = build_offset_map(log.batches, aborted=(), up_to=4)
    first = clean(log.batches[:2], offset_map=offset_map, up_to=4, active={})
    assert first.txn_state.committed == {8}
    second = clean(
        log.batches[2:],
        offset_map=offset_map,
        up_to=4,
        base=2,
        active={},
        txn_state=first.txn_state,
    )
    assert headers_of(second)[0].delete_horizon_ms is None  # its data was read: not discardable
    alone = clean(log.batches[2:], offset_map=offset_map, up_to=4, base=2, active={})
    assert headers_of(alone)[0].delete_horizon_ms == NOW + DAY


def test_an_aborted_transaction_ends_at_its_marker_whichever_group_lists_it() -> None:
    log = Log()
    log.append((b"k1", b"x"), pid=7, txn=True)  # group 1
    log.append((b"k2", b"y"))
    log.append((b"k1", b"x"), pid=7, txn=True)  # group 2
    log.end_txn(7, commit=False)
    log.append((b"k1", b"after"), pid=7, txn=True)  # group 3: a new, committed transaction
    log.end_txn(7, commit=True)
    log.append((b"k3", b"z"))
    offset_map = build_offset_map(log.batches, aborted=log.aborted, up_to=7)
    assert offset_map[b"k1"] == 4
    state: TxnCleaningState | None = None
    kept: list[tuple[int, bytes | None, bytes | None]] = []
    indexed: list[AbortedRange] = []
    for base, group in ((0, log.batches[:2]), (2, log.batches[2:4]), (4, log.batches[4:])):
        # each group is given every aborted transaction of the log, the ended one included
        result = clean(
            group,
            log.aborted,
            offset_map=offset_map,
            up_to=7,
            base=base,
            active={},
            txn_state=state,
        )
        state = result.txn_state
        kept += kv(result)
        indexed += result.aborted_txns
    assert kept == [(1, b"k2", b"y"), (4, b"k1", b"after"), (6, b"k3", b"z")]
    assert indexed == log.aborted


def test_an_aborted_transaction_whose_marker_is_gone_ends_at_the_markers_offset() -> None:
    log = Log()
    log.append((b"k1", b"x"), pid=7, txn=True)
    log.append((b"k2", b"y"))
    log.end_txn(7, commit=False)
    log.append((b"k1", b"after"), pid=7, txn=True)  # a new, committed transaction
    log.end_txn(7, commit=True)
    log.append((b"k3", b"z"))
    # earlier cleanings removed the aborted data and then its marker; the index entry stayed
    later = [log.batches[1], *log.batches[3:]]
    result = clean(later, log.aborted, active={})
    assert kv(result) == [(1, b"k2", b"y"), (3, b"k1", b"after"), (5, b"k3", b"z")]
    assert build_offset_map(later, aborted=log.aborted, up_to=6)[b"k1"] == 3


def test_an_index_entry_that_outlived_its_marker_hides_no_later_abort() -> None:
    log = Log()
    log.append((b"k1", b"x"), pid=7, txn=True)
    log.end_txn(7, commit=False)
    log.append((b"k1", b"aborted too"), pid=7, txn=True)
    log.end_txn(7, commit=False)
    log.append((b"k3", b"z"))
    later = log.batches[2:]  # the first transaction's data and marker were cleaned away
    result = clean(later, log.aborted, active={})
    assert kv(result) == [(4, b"k3", b"z")]
    assert result.aborted_txns == (log.aborted[1],)


def test_batches_out_of_order_are_refused() -> None:
    log = Log()
    log.append((b"k1", b"a"))
    log.append((b"k2", b"b"))
    with pytest.raises(ValueError):
        clean(list(reversed(log.batches)))
    with pytest.raises(ValueError):
        clean(log.batches[1:], base=2)


# -- random histories ------------------------------------------------------------------------

KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]
records_st = st.lists(
    st.tuples(st.sampled_from(KEYS), st.none() | st.binary(min_size=1, max_size=6)),
    min_size=1,
    max_size=4,
)


@dataclass
class History:
    log: Log
    cuts: list[int]  # segment boundaries, as indexes into the batches
    up_to: int


@st.composite
def histories(draw: st.DrawFn, transactions: bool) -> History:
    log = Log()
    kinds = ["plain", "idempotent"] + (["txn", "txn", "end"] if transactions else [])
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(kinds))
        codec = draw(st.sampled_from(list(Compression)))
        if kind == "end" and log.open_txns:
            pid = draw(st.sampled_from(sorted(log.open_txns)))
            log.end_txn(pid, commit=draw(st.booleans()))
        elif kind == "txn":
            log.append(*draw(records_st), pid=draw(st.sampled_from([7, 8])), txn=True, codec=codec)
        else:
            log.append(*draw(records_st), pid=5 if kind == "idempotent" else -1, codec=codec)
    for pid in sorted(log.open_txns):
        log.end_txn(pid, commit=draw(st.booleans()))
    n = len(log.batches)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=3))) if n > 1 else []
    bases = [record_batch.parse_header(b).base_offset for b in log.batches]
    up_to = draw(st.sampled_from([*bases[1:], log.next_offset]))
    return History(log, cuts, up_to)


def segments(batches: Sequence[bytes], cuts: Sequence[int]) -> list[list[bytes]]:
    bounds = [0, *cuts, len(batches)]
    return [list(batches[a:b]) for a, b in itertools.pairwise(bounds)]


def clean_round(
    segs: Sequence[tuple[int, list[bytes]]],
    history: History,
    now: int,
    active: dict[int, ProducerLastRecord],
) -> list[CleanedSegment]:
    """One cleaning round: one map over everything, then each segment, state passed on."""
    every = [b for _, batches in segs for b in batches]
    offset_map = build_offset_map(every, aborted=history.log.aborted, up_to=history.up_to)
    out: list[CleanedSegment] = []
    state = None
    for base, batches in segs:
        result = clean_batches(
            batches,
            offset_map,
            segment_base=base,
            clean_up_to=history.up_to,
            aborted=history.log.aborted,
            delete_retention_ms=DAY,
            now_ms=now,
            active_producers=active,
            txn_state=state,
        )
        state = result.txn_state
        out.append(result)
    return out


def latest_values(batches: Sequence[bytes], aborted_batches: set[int]) -> dict[bytes, tuple]:
    """Each key's last (offset, value) among data records outside aborted transactions."""
    latest: dict[bytes, tuple] = {}
    for b in batches:
        h = record_batch.parse_header(b)
        if h.is_control or h.base_offset in aborted_batches:
            continue
        for r in parse_records(b):
            assert r.key is not None
            latest[r.key] = (r.offset, r.value)
    return latest


def aborted_batch_offsets(log: Log) -> set[int]:
    out = set()
    for b in log.batches:
        h = record_batch.parse_header(b)
        if h.is_transactional and not h.is_control:
            for t in log.aborted:
                if (
                    t.producer_id == h.producer_id
                    and t.first_offset <= h.base_offset < t.last_offset
                ):
                    out.add(h.base_offset)
    return out


def closing_markers(log: Log) -> dict[int, int]:
    """Base offset of each transactional data batch -> offset of the marker that ends it."""
    out: dict[int, int] = {}
    open_batches: dict[int, list[int]] = {}
    for b in log.batches:
        h = record_batch.parse_header(b)
        if h.is_control:
            for base in open_batches.pop(h.producer_id, []):
                out[base] = h.base_offset
        elif h.is_transactional:
            open_batches.setdefault(h.producer_id, []).append(h.base_offset)
    return out


def check_round(
    history: History, spans: Sequence[tuple[int, int]], results: Sequence[CleanedSegment]
) -> list[Record]:
    """What must hold after any round; returns the data records kept."""
    original = {r.offset: r for r in records_of(history.log.batches)}
    aborted = aborted_batch_offsets(history.log)
    closing = closing_markers(history.log)
    kept_headers = []
    for (base, end), result in zip(spans, results, strict=True):
        assert (result.base_offset, result.end_offset) == (base, end)
        assert sum(b.count for b in result.batches) == end - base  # the input span
        covered = base
        for batch in result.batches:
            h = record_batch.validate_batch(batch.data, from_producer=False)
            parse_records(batch.data)
            assert h.base_offset == batch.base_offset >= covered
            assert h.last_offset + 1 == covered + batch.count  # stream batches are contiguous
            covered += batch.count
            kept_headers.append(h)
    kept_bases = {h.base_offset for h in kept_headers}
    data: list[Record] = []
    for result in results:
        for batch in result.batches:
            h = record_batch.parse_header(batch.data)
            if h.is_transactional and not h.is_control:
                assert closing[h.base_offset] in kept_bases  # a marker stays while data does
            if not h.is_control:
                if h.base_offset in aborted:
                    assert h.records_count == 0
                data.extend(parse_records(batch.data))
    offsets = [r.offset for r in data]
    assert offsets == sorted(set(offsets))  # strictly increasing
    assert all(original[r.offset] == r for r in data)  # offsets, timestamps, key, value, headers
    return data


def check_history(history: History) -> None:
    """Clean ``history`` in rounds a day apart and check each against the original log."""
    log = history.log
    active = last_records_of_producers(log.batches)
    segs = segments(log.batches, history.cuts)
    bases = [record_batch.parse_header(s[0]).base_offset for s in segs]
    spans = list(zip(bases, [*bases[1:], log.next_offset], strict=True))
    expected = latest_values(log.batches, aborted_batch_offsets(log))

    first = clean_round(list(zip(bases, segs, strict=True)), history, NOW, active)
    kept = check_round(history, spans, first)
    assert {r.key: (r.offset, r.value) for r in kept} == expected
    for batch in (b.data for result in first for b in result.batches):
        horizon = record_batch.parse_header(batch).delete_horizon_ms
        if any(r.value is None for r in parse_records(batch)):
            assert horizon == NOW + DAY  # every batch that keeps a tombstone got one
        else:
            assert horizon in (None, NOW + DAY)
    # one call for all the segments keeps the same records
    whole = clean_batches(
        log.batches,
        build_offset_map(log.batches, aborted=log.aborted, up_to=history.up_to),
        segment_base=0,
        clean_up_to=history.up_to,
        aborted=log.aborted,
        delete_retention_ms=DAY,
        now_ms=NOW,
        active_producers=active,
    )
    assert kv(whole) == [(r.offset, r.key, r.value) for r in kept]

    # rounds past the delete horizons: tombstones of the cleaned range go, markers follow
    without_tombstones = {
        k: (o, v) for k, (o, v) in expected.items() if v is not None or o >= history.up_to
    }
    results = first
    for day in (1, 2, 3):
        again = [(r.base_offset, data_of(r)) for r in results]
        results = clean_round(again, history, NOW + day * DAY, active)
        kept = check_round(history, spans, results)
        assert {r.key: (r.offset, r.value) for r in kept} == without_tombstones


@settings(max_examples=100, deadline=None)
@given(histories(transactions=False))
def test_random_histories_without_transactions(history: History) -> None:
    check_history(history)


@settings(max_examples=150, deadline=None)
@given(histories(transactions=True))
def test_random_histories_with_transactions(history: History) -> None:
    check_history(history)
