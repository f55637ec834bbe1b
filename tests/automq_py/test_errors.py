"""The storage-exception -> Kafka error mapping (pure)."""

from __future__ import annotations

import pytest

from automq_py.errors import describe, kafka_error
from automq_py.log.elastic_log import LogOffsetOutOfRangeError
from automq_py.log.elastic_log_meta import CorruptLogMetaError
from protocol.errors import ErrorCode
from storage.errors import StorageFailedError, StreamClosedError, StreamFencedError
from storage.metadata.model import ErrorCode as MetadataCode
from storage.metadata.model import MetadataError
from storage.object_format import CorruptObjectError
from storage.operator.base import ObjectNotFoundError, ObjectStoreError
from storage.wal.errors import CorruptWALError, WALError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (StreamFencedError("epoch 3 > 2"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (StreamClosedError("closed"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (StorageFailedError("fsync failed"), ErrorCode.KAFKA_STORAGE_ERROR),
        (LogOffsetOutOfRangeError(5, 10, 20), ErrorCode.OFFSET_OUT_OF_RANGE),
        (WALError("disk"), ErrorCode.KAFKA_STORAGE_ERROR),
        (CorruptWALError("crc"), ErrorCode.KAFKA_STORAGE_ERROR),
        (ObjectStoreError("s3 down"), ErrorCode.KAFKA_STORAGE_ERROR),
        (ObjectNotFoundError("k"), ErrorCode.KAFKA_STORAGE_ERROR),
        (CorruptObjectError("truncated"), ErrorCode.KAFKA_STORAGE_ERROR),
        (CorruptLogMetaError("bad"), ErrorCode.KAFKA_STORAGE_ERROR),
        (MetadataError(MetadataCode.STREAM_FENCED, "x"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (MetadataError(MetadataCode.NODE_FENCED, "x"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (MetadataError(MetadataCode.STREAM_INNER_ERROR, "x"), ErrorCode.KAFKA_STORAGE_ERROR),
        (TimeoutError(), ErrorCode.REQUEST_TIMED_OUT),
        (RuntimeError("bug"), ErrorCode.UNKNOWN_SERVER_ERROR),
        (KeyError("bug"), ErrorCode.UNKNOWN_SERVER_ERROR),
    ],
)
def test_each_failure_has_its_kafka_error(error: BaseException, code: ErrorCode) -> None:
    assert kafka_error(error) == code


def test_the_message_names_the_exception() -> None:
    assert describe(ObjectStoreError("s3 down")) == "ObjectStoreError: s3 down"
    assert describe(TimeoutError()) == "TimeoutError"
