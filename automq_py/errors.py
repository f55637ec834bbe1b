"""One mapping from the storage layer's exceptions to the Kafka error a client is given.

Kafka's ReplicaManager answers a partition whose log failed with an error code for that
partition and keeps the connection: a fenced or closed stream means this broker no longer
leads the partition (NOT_LEADER_OR_FOLLOWER: the client refreshes metadata and retries); the
WAL, the object store or the metadata failing is KAFKA_STORAGE_ERROR; anything unforeseen is
UNKNOWN_SERVER_ERROR. Handlers call :func:`kafka_error` per partition; the dispatcher uses it
for whatever still escapes a handler.
"""

from __future__ import annotations

import logging

from protocol.errors import ErrorCode
from storage.errors import (
    OffsetOutOfRangeError,
    StorageFailedError,
    StreamClosedError,
    StreamFencedError,
)
from storage.metadata.model import ErrorCode as MetadataCode
from storage.metadata.model import MetadataError
from storage.object_format import CorruptObjectError
from storage.operator.base import ObjectNotFoundError, ObjectStoreError
from storage.wal.errors import WALError

log = logging.getLogger("automq.errors")


class NotLeaderError(StreamClosedError):
    """This broker does not lead the partition (now): the client asks the metadata again."""


# metadata refusals that mean another epoch or node owns the stream now
_NOT_OURS = frozenset(
    {
        MetadataCode.STREAM_FENCED,
        MetadataCode.NODE_FENCED,
        MetadataCode.NODE_EPOCH_EXPIRED,
        MetadataCode.STREAM_NOT_OPENED,
    }
)

# checked in order: subclasses before their bases
_BY_TYPE: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (StreamFencedError, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (StorageFailedError, ErrorCode.KAFKA_STORAGE_ERROR),  # Kafka's offline log directory
    (StreamClosedError, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (OffsetOutOfRangeError, ErrorCode.OFFSET_OUT_OF_RANGE),
    (WALError, ErrorCode.KAFKA_STORAGE_ERROR),
    (ObjectStoreError, ErrorCode.KAFKA_STORAGE_ERROR),
    (ObjectNotFoundError, ErrorCode.KAFKA_STORAGE_ERROR),
    (CorruptObjectError, ErrorCode.KAFKA_STORAGE_ERROR),
    (TimeoutError, ErrorCode.REQUEST_TIMED_OUT),
)


def kafka_error(error: BaseException) -> ErrorCode:
    """The error code a client gets for ``error`` raised while serving its request."""
    if isinstance(error, MetadataError):
        return (
            ErrorCode.NOT_LEADER_OR_FOLLOWER
            if error.code in _NOT_OURS
            else ErrorCode.KAFKA_STORAGE_ERROR
        )
    for kind, code in _BY_TYPE:
        if isinstance(error, kind):
            return code
    # the log's own corruption errors (CorruptLogMetaError...) are storage failures too
    if type(error).__module__.startswith(("storage.", "automq_py.log.")):
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.UNKNOWN_SERVER_ERROR


def describe(error: BaseException) -> str:
    """The error message sent beside the code: the exception's type and text."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def partition_failed(action: str, topic: str, index: int, error: BaseException) -> ErrorCode:
    """Log that ``action`` on partition ``topic``-``index`` raised ``error`` and return its code
    (an offset out of range or a partition led elsewhere is the client's business, not logged);
    the request's other partitions go on."""
    code = kafka_error(error)
    if code != ErrorCode.OFFSET_OUT_OF_RANGE and not isinstance(error, NotLeaderError):
        log.warning("%s %s-%d failed: %s (%s)", action, topic, index, describe(error), code.name)
    return code
