"""Partition's record checks (Kafka's LogValidator.validateRecord): which records of a batch fail
it and the batch's answer, with the messages a Kafka 3.9.0 broker gave for the same batches."""

from __future__ import annotations

from automq_py.partition import invalid_records
from protocol.errors import ErrorCode
from protocol.produce import RecordError
from protocol.records import Compression, RecordInput, build_batch

KEYLESS = "Compacted topic cannot accept message without key in topic partition t-0"


def batch(
    keys: list[bytes | None],
    timestamps: list[int] | None = None,
    compression: Compression = Compression.NONE,
) -> memoryview:
    times = timestamps or [1_000] * len(keys)
    records = [RecordInput(b"v", k, timestamp=ts) for k, ts in zip(keys, times, strict=True)]
    return memoryview(bytes(build_batch(records, compression=compression)))


def test_nothing_is_read_when_there_is_nothing_to_check() -> None:
    assert invalid_records(batch([None]), "t-0", compact=False, bounds=None) is None
    assert invalid_records(batch([b"k"] * 3), "t-0", compact=True, bounds=None) is None


def test_every_keyless_record_of_a_compacted_topic_is_named() -> None:
    found = invalid_records(batch([b"k", None, b"k", None, b"k"]), "t-0", compact=True, bounds=None)
    assert found == (
        ErrorCode.INVALID_RECORD,
        "One or more records have been rejected due to 2 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, message='{KEYLESS}'), "
        f"RecordError(batchIndex=3, message='{KEYLESS}')]",
        (RecordError(1, KEYLESS), RecordError(3, KEYLESS)),
    )


def test_the_message_shows_three_of_them_in_a_compressed_batch_too() -> None:
    found = invalid_records(
        batch([None] * 5, compression=Compression.ZSTD), "t-0", compact=True, bounds=None
    )
    assert found is not None
    code, message, errors = found
    assert code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in errors] == [0, 1, 2, 3, 4]
    assert message.startswith("One or more records have been rejected due to 5 record errors")
    assert message.endswith(f"RecordError(batchIndex=2, message='{KEYLESS}')]")
    assert message.count("RecordError(") == 3


def test_a_timestamp_out_of_bounds_makes_it_invalid_timestamp() -> None:
    # record 0: no key (checked first), record 1 too old, record 2 none (-1: never checked)
    records = batch([None, b"k", b"k", b"k"], [5, 5, -1, 150])
    found = invalid_records(records, "t-0", compact=True, bounds=(100, 200))
    assert found is not None
    code, message, errors = found
    assert code == ErrorCode.INVALID_TIMESTAMP
    assert message == "One or more records have been rejected due to invalid timestamp"
    assert errors == (
        RecordError(0, KEYLESS),
        RecordError(
            1,
            "Timestamp 5 of message with offset 1 is out of range. The timestamp should be "
            "within [100, 200]",
        ),
    )
    assert invalid_records(batch([b"k"], [150]), "t-0", compact=False, bounds=(100, 200)) is None
