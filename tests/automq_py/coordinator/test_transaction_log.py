"""The ``__transaction_state`` record format: pinned bytes, Kafka's tolerance rules, round
trips, kafka-python's schema codec as an oracle, and fuzzed decoders."""

from __future__ import annotations

import contextlib
import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.coordinator.transaction_log import (
    TopicPartitions,
    TransactionLogFormatError,
    TransactionLogKey,
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tests.automq_py.coordinator import kafka_oracle
from tests.protocol.kafka_oracle import uvarint

i8 = st.integers(-(1 << 7), (1 << 7) - 1)
i16 = st.integers(-(1 << 15), (1 << 15) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
names = st.text(max_size=30)

topic_partitions = st.builds(TopicPartitions, names, st.lists(i32, max_size=6).map(tuple))
partitions = st.none() | st.lists(topic_partitions, max_size=4).map(tuple)


def values(flexible: bool) -> st.SearchStrategy[TransactionLogValue]:
    """Values writable in v1 (any tags) or in v0 (tags at their defaults)."""
    tags = (i64, i64, i16) if flexible else (st.just(-1), st.just(-1), st.just(0))
    return st.builds(TransactionLogValue, i64, i16, i32, i8, partitions, i64, i64, *tags)


ONGOING = TransactionLogValue(
    producer_id=1000,
    producer_epoch=3,
    timeout_ms=60000,
    status=1,
    partitions=(TopicPartitions("a", (0, 1)), TopicPartitions("bb", (7,))),
    last_update_timestamp_ms=1700000000123,
    start_timestamp_ms=1700000000000,
)


# --- bytes derived by hand from Kafka's schemas ----------------------------------------------


def test_key_bytes() -> None:
    raw = encode_key(TransactionLogKey("txn-1"))
    assert raw == b"\x00\x00" + b"\x00\x05" + b"txn-1"
    assert decode_key(raw) == TransactionLogKey("txn-1")


def test_value_v0_bytes() -> None:
    expected = (
        struct.pack(">h", 0)  # value version
        + struct.pack(">qhib", 1000, 3, 60000, 1)
        + struct.pack(">i", 2)  # two topics
        + struct.pack(">h1si", 1, b"a", 2)
        + struct.pack(">ii", 0, 1)
        + struct.pack(">h2si", 2, b"bb", 1)
        + struct.pack(">i", 7)
        + struct.pack(">qq", 1700000000123, 1700000000000)
    )
    assert encode_value(ONGOING) == expected
    assert decode_value(expected) == ONGOING


def test_empty_transaction_v0_has_null_partitions() -> None:
    empty = TransactionLogValue(1000, 4, 60000, 0, None, 5, -1)
    expected = struct.pack(">hqhibiqq", 0, 1000, 4, 60000, 0, -1, 5, -1)
    assert encode_value(empty) == expected
    assert decode_value(expected) == empty


def test_value_v1_bytes() -> None:
    value = TransactionLogValue(
        1000, 3, 60000, 1, ONGOING.partitions, 1700000000123, 1700000000000,
        previous_producer_id=999,
        next_producer_id=1001,
        client_transaction_version=2,
    )  # fmt: skip
    expected = (
        struct.pack(">h", 1)
        + struct.pack(">qhib", 1000, 3, 60000, 1)
        + b"\x03"  # compact array: 2 topics + 1
        + b"\x02a" + b"\x03" + struct.pack(">ii", 0, 1) + b"\x00"  # topic, ids, no tags
        + b"\x03bb" + b"\x02" + struct.pack(">i", 7) + b"\x00"
        + struct.pack(">qq", 1700000000123, 1700000000000)
        + b"\x03"  # three tagged fields, in tag order: tag, size, value
        + b"\x00\x08" + struct.pack(">q", 999)
        + b"\x01\x08" + struct.pack(">q", 1001)
        + b"\x02\x02" + struct.pack(">h", 2)
    )  # fmt: skip
    assert encode_value(value, version=1) == expected
    assert decode_value(expected) == value


def test_value_v1_writes_only_tags_that_are_not_default() -> None:
    empty = TransactionLogValue(7, 0, 100, 0, None, 1, -1, client_transaction_version=2)
    expected = struct.pack(">hqhib", 1, 7, 0, 100, 0) + b"\x00"  # null compact array
    expected += struct.pack(">qq", 1, -1) + b"\x01" + b"\x02\x02\x00\x02"
    assert encode_value(empty, version=1) == expected
    assert decode_value(expected) == empty
    # with every tag at its default the tagged-field section is one 0 byte
    plain = encode_value(ONGOING, version=1)
    assert plain.endswith(struct.pack(">qq", 1700000000123, 1700000000000) + b"\x00")
    assert decode_value(plain) == ONGOING


# --- versions and Kafka's tolerance rules ------------------------------------------------------


def test_v0_cannot_carry_tagged_fields() -> None:
    for tagged in (
        TransactionLogValue(1, 0, 1, 0, None, 0, 0, previous_producer_id=5),
        TransactionLogValue(1, 0, 1, 0, None, 0, 0, next_producer_id=5),
        TransactionLogValue(1, 0, 1, 0, None, 0, 0, client_transaction_version=2),
    ):
        with pytest.raises(TransactionLogFormatError, match="version 1"):
            encode_value(tagged)
        assert decode_value(encode_value(tagged, version=1)) == tagged


@pytest.mark.parametrize("version", [-1, 2, 0x7FFF])
def test_unknown_value_versions_are_errors(version: int) -> None:
    body = encode_value(ONGOING)[2:]
    with pytest.raises(TransactionLogFormatError, match="version"):
        decode_value(struct.pack(">h", version) + body)
    with pytest.raises(TransactionLogFormatError, match="version"):
        encode_value(ONGOING, version=version)


def test_unknown_key_versions_are_skipped_as_kafka_does() -> None:
    assert decode_key(struct.pack(">hh1s", 1, 1, b"t")) is None
    assert decode_key(struct.pack(">h", -1)) is None


def test_tombstone() -> None:
    assert decode_value(None) is None


def test_trailing_bytes_are_ignored() -> None:
    assert decode_key(encode_key(TransactionLogKey("t")) + b"\xff\x00") == TransactionLogKey("t")
    for version in (0, 1):
        assert decode_value(encode_value(ONGOING, version) + b"\x01\x02\x03") == ONGOING


def test_unknown_tags_are_skipped() -> None:
    raw = encode_value(ONGOING, version=1)
    # a top-level tag 7 of 3 bytes, then tag 2, after the timestamps
    newer = raw[:-1] + b"\x02" + b"\x07\x03abc" + b"\x02\x02\x00\x05"
    assert decode_value(newer) == dataclasses.replace(ONGOING, client_transaction_version=5)
    # a tag inside a partitions entry
    entry = b"\x02a" + b"\x02" + struct.pack(">i", 4) + b"\x01" + b"\x05\x01z"
    inner = struct.pack(">hqhib", 1, 1, 0, 1, 1) + b"\x02" + entry + struct.pack(">qq", 2, 3)
    decoded = decode_value(inner + b"\x00")
    assert decoded is not None and decoded.partitions == (TopicPartitions("a", (4,)),)


def test_known_tag_with_the_wrong_size_is_an_error() -> None:
    raw = encode_value(ONGOING, version=1)[:-1] + b"\x01" + b"\x00\x04" + b"\x00" * 4
    with pytest.raises(TransactionLogFormatError, match="tag 0"):
        decode_value(raw)


def test_negative_lengths() -> None:
    head = struct.pack(">hqhib", 0, 1, 0, 1, 1)
    tail = struct.pack(">qq", 2, 3)
    # a null topic or null partition ids are corrupt (the fields are not nullable)
    with pytest.raises(TransactionLogFormatError, match="null string"):
        decode_value(head + struct.pack(">ihi", 1, -1, 0) + tail)
    with pytest.raises(TransactionLogFormatError, match="null array"):
        decode_value(head + struct.pack(">ih1si", 1, 1, b"a", -1) + tail)
    with pytest.raises(TransactionLogFormatError, match="null string"):
        decode_key(struct.pack(">hh", 0, -1))
    # Kafka reads any negative count of the nullable partitions array as null
    decoded = decode_value(head + struct.pack(">i", -2) + tail)
    assert decoded is not None and decoded.partitions is None
    # compact forms: 0 is null, for the topic and the ids
    flex = struct.pack(">hqhib", 1, 1, 0, 1, 1)
    with pytest.raises(TransactionLogFormatError, match="null string"):
        decode_value(flex + b"\x02\x00\x01\x00" + tail + b"\x00")
    with pytest.raises(TransactionLogFormatError, match="null array"):
        decode_value(flex + b"\x02\x02a\x00\x00" + tail + b"\x00")


def test_counts_larger_than_the_data_are_errors() -> None:
    head = struct.pack(">hqhib", 0, 1, 0, 1, 1)
    with pytest.raises(TransactionLogFormatError, match="does not fit"):
        decode_value(head + struct.pack(">i", 1 << 30))
    with pytest.raises(TransactionLogFormatError, match="does not fit"):
        decode_value(head + struct.pack(">ih1si", 1, 1, b"a", 1 << 29))


def test_bad_utf8_and_long_varints_are_errors() -> None:
    with pytest.raises(TransactionLogFormatError, match="UTF-8"):
        decode_key(b"\x00\x00\x00\x01\xff")
    flex = struct.pack(">hqhib", 1, 1, 0, 1, 1)
    with pytest.raises(TransactionLogFormatError, match="varint"):
        decode_value(flex + b"\x80\x80\x80\x80\x80\x01")


def test_values_that_do_not_fit_their_fields_are_refused() -> None:
    with pytest.raises(TransactionLogFormatError, match="32767"):
        encode_key(TransactionLogKey("x" * 0x8000))
    with pytest.raises(TransactionLogFormatError, match="32767"):
        encode_value(TransactionLogValue(1, 0, 1, 1, (TopicPartitions("t" * 0x8000, ()),), 0, 0))
    with pytest.raises(TransactionLogFormatError, match="out of range"):
        encode_value(TransactionLogValue(1, 0, 1, 128, None, 0, 0))
    with pytest.raises(TransactionLogFormatError, match="out of range"):
        encode_value(TransactionLogValue(1, 0, 1, 1, (TopicPartitions("t", (1 << 31,)),), 0, 0))
    with pytest.raises(TransactionLogFormatError, match="UTF-8"):
        encode_key(TransactionLogKey("\ud800"))
    assert encode_key(TransactionLogKey("x" * 0x7FFF))[2:4] == b"\x7f\xff"


# --- round trips -------------------------------------------------------------------------------


@given(names)
def test_key_round_trip(transactional_id: str) -> None:
    key = TransactionLogKey(transactional_id)
    assert decode_key(encode_key(key)) == key


@given(values(flexible=False))
def test_value_v0_round_trip(value: TransactionLogValue) -> None:
    raw = encode_value(value)
    assert raw[:2] == b"\x00\x00"
    assert decode_value(raw) == value
    # v1 carries the same value
    assert decode_value(encode_value(value, version=1)) == value


@given(values(flexible=True))
def test_value_v1_round_trip(value: TransactionLogValue) -> None:
    raw = encode_value(value, version=1)
    assert raw[:2] == b"\x00\x01"
    assert decode_value(raw) == value


# --- kafka-python's schema codec as an oracle --------------------------------------------------


def _oracle_fields(decoded: object) -> TransactionLogValue:
    parts = decoded.transaction_partitions  # type: ignore[attr-defined]
    return TransactionLogValue(
        decoded.producer_id,  # type: ignore[attr-defined]
        decoded.producer_epoch,  # type: ignore[attr-defined]
        decoded.transaction_timeout_ms,  # type: ignore[attr-defined]
        decoded.transaction_status,  # type: ignore[attr-defined]
        None
        if parts is None
        else tuple(TopicPartitions(p.topic, tuple(p.partition_ids)) for p in parts),
        decoded.transaction_last_update_timestamp_ms,  # type: ignore[attr-defined]
        decoded.transaction_start_timestamp_ms,  # type: ignore[attr-defined]
        decoded.previous_producer_id,  # type: ignore[attr-defined]
        decoded.next_producer_id,  # type: ignore[attr-defined]
        decoded.client_transaction_version,  # type: ignore[attr-defined]
    )


def _oracle_encode(value: TransactionLogValue, version: int) -> bytes:
    oracle = kafka_oracle.TransactionLogValue
    fields = {
        "producer_id": value.producer_id,
        "producer_epoch": value.producer_epoch,
        "transaction_timeout_ms": value.timeout_ms,
        "transaction_status": value.status,
        "transaction_partitions": None
        if value.partitions is None
        else [
            oracle.PartitionsSchema(topic=p.topic, partition_ids=list(p.partition_ids))
            for p in value.partitions
        ],
        "transaction_last_update_timestamp_ms": value.last_update_timestamp_ms,
        "transaction_start_timestamp_ms": value.start_timestamp_ms,
    }
    # as Kafka's generated writer, set only the tags that differ from their defaults
    for name, default in (
        ("previous_producer_id", -1),
        ("next_producer_id", -1),
        ("client_transaction_version", 0),
    ):
        if getattr(value, name) != default:
            fields[name] = getattr(value, name)
    return bytes(oracle(version=version, **fields).encode(version=version))


@given(values(flexible=False), st.sampled_from([0, 1]))
def test_kafka_python_reads_and_writes_v0_the_same(value: TransactionLogValue, v: int) -> None:
    ours = encode_value(value, version=v)
    assert ours == _oracle_encode(value, v)
    assert _oracle_fields(kafka_oracle.TransactionLogValue.decode(ours)) == value


@given(values(flexible=True))
def test_kafka_python_reads_and_writes_v1_the_same(value: TransactionLogValue) -> None:
    ours = encode_value(value, version=1)
    assert ours == _oracle_encode(value, 1)
    assert _oracle_fields(kafka_oracle.TransactionLogValue.decode(ours)) == value


@given(names)
def test_kafka_python_key_is_the_same(transactional_id: str) -> None:
    oracle = kafka_oracle.TransactionLogKey(version=0, transactional_id=transactional_id)
    assert encode_key(TransactionLogKey(transactional_id)) == bytes(oracle.encode(version=0))


# --- fuzz: only the module's error or a valid result -------------------------------------------


def _decode_or_error(data: bytes) -> None:
    for decode in (decode_key, decode_value):
        with contextlib.suppress(TransactionLogFormatError):
            decode(data)


@given(st.binary(max_size=300))
def test_decoders_on_arbitrary_bytes(data: bytes) -> None:
    _decode_or_error(data)
    # with a valid version in front, the decoders get past the first field
    for version in (b"\x00\x00", b"\x00\x01"):
        _decode_or_error(version + data)


@given(values(flexible=True), st.sampled_from([0, 1]), st.data())
def test_every_truncation_is_an_error(
    value: TransactionLogValue, version: int, data: st.DataObject
) -> None:
    if version == 0:
        value = dataclasses.replace(
            value, previous_producer_id=-1, next_producer_id=-1, client_transaction_version=0
        )
    raw = encode_value(value, version)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(TransactionLogFormatError):
        decode_value(raw[:cut])
    key = encode_key(TransactionLogKey("txn"))
    with pytest.raises(TransactionLogFormatError):
        decode_key(key[: data.draw(st.integers(0, len(key) - 1))])


@given(values(flexible=True), st.data())
def test_corrupted_values_decode_or_fail_cleanly(
    value: TransactionLogValue, data: st.DataObject
) -> None:
    raw = bytearray(encode_value(value, version=1))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw[:2] = data.draw(st.sampled_from([b"\x00\x00", b"\x00\x01"]))
    try:
        decoded = decode_value(bytes(raw))
    except TransactionLogFormatError:
        return
    assert isinstance(decoded, TransactionLogValue)


def test_multi_byte_varints() -> None:
    ids = tuple(range(299))
    value = TransactionLogValue(1, 0, 1, 1, (TopicPartitions("t", ids),), 0, 0)
    raw = encode_value(value, version=1)
    # after version and the fixed fields (17 bytes): 1 topic, "t", then 299 + 1 ids
    assert raw[17:20] == b"\x02\x02t" and raw[20:22] == uvarint(300) == b"\xac\x02"
    assert decode_value(raw) == value
    assert raw == _oracle_encode(value, 1)
