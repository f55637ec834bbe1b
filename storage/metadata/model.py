"""The metadata's plain data: streams, ranges, objects, nodes, and the errors of the controller.

Names and numbers follow AutoMQ's controller (``StreamControlManager``,
``S3ObjectControlManager``, ``Errors``). Everything here is immutable: the image replaces a
value when a record changes it, so a reader may keep what it read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from storage.object_format import StreamOffsetRange

__all__ = [
    "INIT_EPOCH",
    "NOOP_OBJECT_ID",
    "CommitRange",
    "CommitStreamObject",
    "ErrorCode",
    "MetadataError",
    "NodeMetadata",
    "ObjectState",
    "RangeMetadata",
    "S3Object",
    "S3ObjectMetadata",
    "S3ObjectType",
    "StreamMetadata",
    "StreamObject",
    "StreamOffsetRange",
    "StreamSetObject",
    "StreamState",
]

INIT_EPOCH = -1
"""A created stream's epoch until its first open (AutoMQ's ``S3StreamConstant.INIT_EPOCH``)."""

NOOP_OBJECT_ID = -1
"""Object id meaning "no object" in a commit (AutoMQ's ``ObjectUtils.NOOP_OBJECT_ID``)."""


class ErrorCode(IntEnum):
    """AutoMQ's controller error codes ("Kafka on S3" block of ``Errors.java``).

    501-506 and 599 are the numbers of AutoMQ's ``Errors.java``; the later additions continue
    the sequence. They travel only between our broker and its metadata, never to Kafka clients.
    """

    STREAM_EXIST = 501
    STREAM_NOT_EXIST = 502
    STREAM_FENCED = 503
    OBJECT_NOT_EXIST = 504
    STREAM_NOT_OPENED = 505
    STREAM_NOT_CLOSED = 506
    OFFSET_NOT_MATCHED = 507
    REDUNDANT_OPERATION = 508
    COMPACTED_OBJECTS_NOT_FOUND = 509
    NODE_EPOCH_EXPIRED = 510
    NODE_EPOCH_NOT_EXIST = 511
    NODE_FENCED = 512
    STREAM_INNER_ERROR = 599


class MetadataError(Exception):
    """A metadata operation was refused; ``code`` says why, in AutoMQ's terms."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


class ObjectState(IntEnum):
    """An object's lifecycle: prepared (id reserved), committed, marked for deletion, deleted."""

    PREPARED = 1
    COMMITTED = 2
    MARK_DESTROYED = 3
    DESTROYED = 4


class StreamState(IntEnum):
    """AutoMQ's ``StreamState``; its byte form is the ordinal."""

    CLOSED = 0
    OPENED = 1


class S3ObjectType(IntEnum):
    """What an object holds: several streams (Stream Set Object) or one (Stream Object)."""

    STREAM_SET = 0
    STREAM = 1


@dataclass(slots=True, frozen=True)
class RangeMetadata:
    """The offsets ``[start_offset, end_offset)`` a stream got while ``node_id`` owned it."""

    stream_id: int
    epoch: int
    range_index: int
    start_offset: int
    end_offset: int
    node_id: int


@dataclass(slots=True, frozen=True)
class StreamObject:
    """An object holding one stream's offsets ``[start_offset, end_offset)``."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    object_size: int


@dataclass(slots=True, frozen=True)
class StreamSetObject:
    """An object mixing several streams, uploaded (or compacted) by one node.

    ``ranges`` is sorted by (stream_id, start_offset), like the object's index; a stream may
    have more than one range in it after compaction.
    """

    object_id: int
    node_id: int
    order_id: int
    data_time_ms: int
    object_size: int
    ranges: tuple[StreamOffsetRange, ...]


@dataclass(slots=True, frozen=True)
class S3Object:
    """One object's lifecycle. Its key follows from its id (``object_format.object_key``)."""

    object_id: int
    state: ObjectState
    object_size: int
    prepared_ms: int
    expires_ms: int
    committed_ms: int | None = None
    mark_destroyed_ms: int | None = None


@dataclass(slots=True, frozen=True)
class StreamMetadata:
    """A stream: ``ranges`` in range_index order, ``stream_objects`` in offset order."""

    stream_id: int
    epoch: int
    state: StreamState
    start_offset: int
    end_offset: int
    ranges: tuple[RangeMetadata, ...] = ()
    stream_objects: tuple[StreamObject, ...] = ()

    @property
    def owner(self) -> int | None:
        """The node that owns the stream's current range, if it was ever opened."""
        return self.ranges[-1].node_id if self.ranges else None


@dataclass(slots=True, frozen=True)
class NodeMetadata:
    """A node: its epoch, failover flag and Stream Set Objects in order_id order."""

    node_id: int
    epoch: int
    failover: bool = False
    stream_set_objects: tuple[StreamSetObject, ...] = ()


@dataclass(slots=True, frozen=True)
class S3ObjectMetadata:
    """One answer of ``get_objects``: an object and the stream's offsets inside it."""

    object_id: int
    object_size: int
    object_type: S3ObjectType
    start_offset: int
    end_offset: int


@dataclass(slots=True, frozen=True)
class CommitRange:
    """A stream's offsets inside a Stream Set Object being committed, at the writer's epoch."""

    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int


@dataclass(slots=True, frozen=True)
class CommitStreamObject:
    """A Stream Object being committed together with a Stream Set Object."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    object_size: int
