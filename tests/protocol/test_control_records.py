"""Transaction markers: pinned bytes, Kafka's tolerance rules, the project's batch reader,
aiokafka's and kafka-python's record readers as oracles, and fuzzed decoders."""

from __future__ import annotations

import contextlib
import struct

import crc32c
import pytest
from aiokafka.record import default_records as aiokafka_records  # type: ignore[import-untyped]
from aiokafka.record.control_record import (  # type: ignore[import-untyped]
    ABORT_MARKER,
    COMMIT_MARKER,
    ControlRecord,
)
from hypothesis import given
from hypothesis import strategies as st
from kafka.record import default_records as kafka_records

from protocol import record_batch
from protocol.control_records import (
    ControlRecordType,
    InvalidControlRecordError,
    TransactionMarker,
    build_marker_batch,
    decode_control_key,
    decode_end_txn_marker,
    decode_marker,
    encode_control_key,
    encode_end_txn_marker,
    parse_marker,
)
from protocol.record_batch import InvalidRecordBatchError
from protocol.records import RecordInput, build_batch, parse_records

i16 = st.integers(-(1 << 15), (1 << 15) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
timestamps = st.integers(0, (1 << 62))

markers = st.fixed_dictionaries(
    {
        "commit": st.booleans(),
        "producer_id": st.integers(0, (1 << 63) - 1),
        "producer_epoch": st.integers(0, (1 << 15) - 1),
        "coordinator_epoch": i32,
        "timestamp_ms": timestamps,
        "base_offset": st.integers(0, (1 << 62)),
        "partition_leader_epoch": i32,
    }
)


def _kafka_marker_batch(
    control_type: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int,
    leader_epoch: int,
) -> bytes:
    """The batch Kafka's ``MemoryRecords.withEndTransactionMarker`` writes, put together by
    hand from the record batch and record layouts."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    # attributes 0, timestamp delta 0, offset delta 0, key length 4 and value length 6 as
    # zigzag varints (8, 12), no headers: 16 bytes, so the record's length varint is 32
    body = b"\x00\x00\x00" + b"\x08" + key + b"\x0c" + value + b"\x00"
    record = b"\x20" + body
    after_crc = struct.pack(
        ">hiqqqhii",
        0x30,  # transactional | control, no compression, CREATE_TIME
        0,  # last offset delta
        timestamp,  # base timestamp
        timestamp,  # max timestamp
        producer_id,
        producer_epoch,
        -1,  # base sequence
        1,  # records
    )
    after_crc += record
    crc = crc32c.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, the rest
    head = struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc)
    return head + after_crc


# --- bytes derived by hand from Kafka's layouts ------------------------------------------------


def test_control_key_and_marker_bytes() -> None:
    assert ControlRecordType.ABORT == 0 and ControlRecordType.COMMIT == 1
    assert encode_control_key(ControlRecordType.ABORT) == b"\x00\x00\x00\x00"
    assert encode_control_key(ControlRecordType.COMMIT) == b"\x00\x00\x00\x01"
    assert encode_end_txn_marker(7) == b"\x00\x00\x00\x00\x00\x07"
    assert encode_end_txn_marker(-2) == b"\x00\x00\xff\xff\xff\xfe"
    assert decode_control_key(b"\x00\x00\x00\x01") == ControlRecordType.COMMIT
    assert decode_end_txn_marker(b"\x00\x00\x00\x00\x01\x00") == 256


@pytest.mark.parametrize("commit", [True, False])
def test_marker_batch_bytes(commit: bool) -> None:
    built = build_marker_batch(commit, 1234, 5, 7, 1700000000000, 42, 3)
    assert len(built) == 78  # Kafka: RECORD_BATCH_OVERHEAD 61 + a 17-byte marker record
    assert bytes(built) == _kafka_marker_batch(int(commit), 1234, 5, 7, 1700000000000, 42, 3)


@given(markers)
def test_marker_batches_are_kafkas(m: dict[str, int]) -> None:
    built = build_marker_batch(**m)  # type: ignore[arg-type]
    expected = _kafka_marker_batch(
        int(m["commit"]),
        m["producer_id"],
        m["producer_epoch"],
        m["coordinator_epoch"],
        m["timestamp_ms"],
        m["base_offset"],
        m["partition_leader_epoch"],
    )
    assert bytes(built) == expected
    assert parse_marker(built) == TransactionMarker(bool(m["commit"]), m["coordinator_epoch"])


# --- readers: the project's, aiokafka's and kafka-python's ------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_project_reader_sees_a_transactional_control_batch(commit: bool) -> None:
    built = build_marker_batch(commit, 99, 4, 11, 1700000000000, base_offset=500)
    header = record_batch.validate_batch(built)  # as a produced batch: CRC and counts
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch) == (99, 4)
    assert header.base_sequence == -1 and header.last_sequence == -1
    assert (header.base_offset, header.partition_leader_epoch) == (500, -1)
    assert header.compression == "NONE" and header.timestamp_type == "CREATE_TIME"
    assert header.records_count == 1 and header.size == len(built)
    (record,) = parse_records(built)
    assert record.offset == 500 and record.timestamp == 1700000000000
    assert record.key == bytes([0, 0, 0, int(commit)]) and record.headers == ()
    assert decode_marker(record.key, record.value) == TransactionMarker(commit, 11)


@pytest.mark.parametrize(
    "batch_class",
    [aiokafka_records.DefaultRecordBatch, aiokafka_records._DefaultRecordBatchPy],
    ids=["aiokafka-c", "aiokafka-py"],
)
@given(m=markers)
def test_aiokafka_reads_the_marker(batch_class: type, m: dict[str, int]) -> None:
    batch = batch_class(bytes(build_marker_batch(**m)))  # type: ignore[arg-type]
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch) == (m["producer_id"], m["producer_epoch"])
    assert batch.base_sequence == -1
    (record,) = list(batch)
    assert record.offset == m["base_offset"] and record.timestamp == m["timestamp_ms"]
    # aiokafka's consumer tells aborts by comparing the parsed key with ABORT_MARKER
    assert ControlRecord.parse(record.key) == (COMMIT_MARKER if m["commit"] else ABORT_MARKER)
    assert struct.unpack(">hi", record.value) == (0, m["coordinator_epoch"])


@given(m=markers)
def test_kafka_python_reads_the_marker(m: dict[str, int]) -> None:
    batch = kafka_records.DefaultRecordBatch(bytes(build_marker_batch(**m)))  # type: ignore[arg-type]
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch) == (m["producer_id"], m["producer_epoch"])
    (record,) = list(batch)
    assert isinstance(record, kafka_records.ControlRecord)
    assert (record.version, record.commit, record.abort) == (0, m["commit"], not m["commit"])
    assert struct.unpack(">hi", record.value) == (0, m["coordinator_epoch"])


# --- Kafka's tolerance rules -------------------------------------------------------------------


def test_newer_versions_are_read_as_version_0() -> None:
    # a later version may only add fields: Kafka reads the known ones and ignores the rest
    assert decode_control_key(b"\x00\x03\x00\x01" + b"more") == ControlRecordType.COMMIT
    assert decode_end_txn_marker(b"\x00\x05\x00\x00\x00\x09" + b"more") == 9
    assert decode_marker(b"\x00\x01\x00\x00\xff", b"\x00\x02\x00\x00\x00\x03\xff") == (False, 3)


def test_negative_versions_and_short_fields_are_corrupt() -> None:
    with pytest.raises(InvalidControlRecordError, match="negative"):
        decode_control_key(b"\xff\xff\x00\x01")
    with pytest.raises(InvalidControlRecordError, match="negative"):
        decode_end_txn_marker(b"\x80\x00\x00\x00\x00\x01")
    for short in (None, b"", b"\x00\x00\x00"):
        with pytest.raises(InvalidControlRecordError, match="4 bytes"):
            decode_control_key(short)
    for short in (None, b"\x00\x00\x00\x00\x00"):
        with pytest.raises(InvalidControlRecordError, match="6 bytes"):
            decode_end_txn_marker(short)


def test_other_control_types_are_not_markers() -> None:
    # Kafka maps unknown types to UNKNOWN (ignored by readers); KRaft's types are known
    assert decode_control_key(b"\x00\x00\x00\x09") == 9
    assert decode_control_key(b"\x00\x00\x00\x02") == ControlRecordType.LEADER_CHANGE
    for control_type in (2, 6, 9, -1):
        with pytest.raises(InvalidControlRecordError, match="not a transaction marker"):
            decode_marker(encode_control_key(control_type), encode_end_txn_marker(0))


def _batch(key: bytes, *, transactional: bool, control: bool) -> bytearray:
    return build_batch(
        [RecordInput(value=encode_end_txn_marker(1), key=key, timestamp=5)],
        producer_id=3,
        producer_epoch=0,
        is_transactional=transactional,
        is_control=control,
    )


def test_parse_marker_refuses_what_is_not_a_marker_batch() -> None:
    commit = encode_control_key(ControlRecordType.COMMIT)
    with pytest.raises(InvalidControlRecordError, match="not a transactional control batch"):
        parse_marker(_batch(commit, transactional=True, control=False))
    with pytest.raises(InvalidControlRecordError, match="not a transactional control batch"):
        parse_marker(_batch(commit, transactional=False, control=True))
    leader_change = encode_control_key(ControlRecordType.LEADER_CHANGE)
    with pytest.raises(InvalidControlRecordError, match="not a transaction marker"):
        parse_marker(_batch(leader_change, transactional=True, control=True))
    assert parse_marker(_batch(commit, transactional=True, control=True)) == (True, 1)


def test_parse_marker_checks_the_crc_unless_told_not_to() -> None:
    built = build_marker_batch(True, 1, 0, 7, 10)
    built[-2] ^= 0x01  # the coordinator epoch's low byte, inside the CRC'd range
    with pytest.raises(InvalidControlRecordError, match="CRC"):
        parse_marker(built)
    assert parse_marker(built, check_crc=False) == (True, 6)


def test_parse_marker_accepts_views_and_the_error_is_a_batch_error() -> None:
    built = build_marker_batch(False, 1, 0, 7, 10)
    assert parse_marker(memoryview(built)) == parse_marker(bytes(built)) == (False, 7)
    assert issubclass(InvalidControlRecordError, InvalidRecordBatchError)
    assert issubclass(InvalidControlRecordError, ValueError)


def test_values_that_do_not_fit_are_refused() -> None:
    with pytest.raises(InvalidControlRecordError):
        encode_control_key(1 << 15)
    with pytest.raises(InvalidControlRecordError):
        encode_end_txn_marker(1 << 31)
    with pytest.raises(InvalidControlRecordError):
        build_marker_batch(True, 1, 0, -(1 << 31) - 1, 0)


# --- fuzz: only the module's error or a valid result -------------------------------------------


@given(st.binary(max_size=16), st.binary(max_size=16))
def test_record_decoders_on_arbitrary_bytes(key: bytes, value: bytes) -> None:
    for call in (
        lambda: decode_control_key(key),
        lambda: decode_end_txn_marker(value),
        lambda: decode_marker(key, value),
    ):
        try:
            result = call()
        except InvalidControlRecordError:
            continue
        assert isinstance(result, int | TransactionMarker)


@given(st.binary(max_size=200))
def test_parse_marker_on_arbitrary_bytes(data: bytes) -> None:
    for candidate in (data, bytes(build_marker_batch(True, 1, 0, 2, 3))[:61] + data):
        for check_crc in (True, False):
            with contextlib.suppress(InvalidControlRecordError):
                parse_marker(candidate, check_crc=check_crc)


@given(markers, st.data())
def test_every_truncation_of_a_marker_batch_is_an_error(
    m: dict[str, int], data: st.DataObject
) -> None:
    built = bytes(build_marker_batch(**m))  # type: ignore[arg-type]
    cut = data.draw(st.integers(0, len(built) - 1))
    with pytest.raises(InvalidControlRecordError):
        parse_marker(built[:cut], check_crc=data.draw(st.booleans()))


@given(markers, st.data())
def test_corrupted_marker_batches_parse_or_fail_cleanly(
    m: dict[str, int], data: st.DataObject
) -> None:
    built = bytearray(build_marker_batch(**m))  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 4))):
        built[data.draw(st.integers(0, len(built) - 1))] = data.draw(st.integers(0, 255))
    try:
        marker = parse_marker(built, check_crc=False)
    except InvalidControlRecordError:
        return
    assert isinstance(marker, TransactionMarker)
