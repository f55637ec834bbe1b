"""Change records: what one metadata operation writes, as a list persisted in one transaction.

Each record sets or removes one row of the durable store and one entry of the in-memory image,
after AutoMQ's KRaft records (``S3StreamRecord``, ``RangeRecord``, ``S3ObjectRecord``, ...).
A record carries the entity's whole new value, so applying it twice is harmless.

=========================  ====================================================================
record                     effect
=========================  ====================================================================
StreamRecord               create a stream or set its epoch, state, start and end offsets
RemoveStream               drop a stream with its ranges and stream objects
RangeRecord                set one range of a stream
RemoveRange                drop one range of a stream
StreamObjectRecord         set one Stream Object of a stream
RemoveStreamObject         drop one Stream Object from its stream
StreamSetObjectRecord      set one Stream Set Object of a node
RemoveStreamSetObject      drop one Stream Set Object from its node
S3ObjectRecord             set an object's lifecycle state
RemoveS3Object             drop an object deleted from object storage (its id is never reused)
NodeRecord                 create a node or set its epoch and failover flag
KVRecord / RemoveKV        set or drop a key
CounterRecord              set the next id a counter hands out
=========================  ====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.metadata.model import (
    RangeMetadata,
    S3Object,
    StreamObject,
    StreamSetObject,
    StreamState,
)

STREAM_ID_COUNTER = "stream_id"
OBJECT_ID_COUNTER = "object_id"


@dataclass(slots=True, frozen=True)
class StreamRecord:
    stream_id: int
    epoch: int
    state: StreamState
    start_offset: int
    end_offset: int


@dataclass(slots=True, frozen=True)
class RemoveStream:
    stream_id: int


@dataclass(slots=True, frozen=True)
class RangeRecord:
    range: RangeMetadata


@dataclass(slots=True, frozen=True)
class RemoveRange:
    stream_id: int
    range_index: int


@dataclass(slots=True, frozen=True)
class StreamObjectRecord:
    stream_object: StreamObject


@dataclass(slots=True, frozen=True)
class RemoveStreamObject:
    stream_id: int
    object_id: int


@dataclass(slots=True, frozen=True)
class StreamSetObjectRecord:
    stream_set_object: StreamSetObject


@dataclass(slots=True, frozen=True)
class RemoveStreamSetObject:
    node_id: int
    object_id: int


@dataclass(slots=True, frozen=True)
class S3ObjectRecord:
    object: S3Object


@dataclass(slots=True, frozen=True)
class RemoveS3Object:
    object_id: int


@dataclass(slots=True, frozen=True)
class NodeRecord:
    node_id: int
    epoch: int
    failover: bool


@dataclass(slots=True, frozen=True)
class KVRecord:
    key: str
    value: bytes


@dataclass(slots=True, frozen=True)
class RemoveKV:
    key: str


@dataclass(slots=True, frozen=True)
class CounterRecord:
    name: str
    next_value: int


Record = (
    StreamRecord
    | RemoveStream
    | RangeRecord
    | RemoveRange
    | StreamObjectRecord
    | RemoveStreamObject
    | StreamSetObjectRecord
    | RemoveStreamSetObject
    | S3ObjectRecord
    | RemoveS3Object
    | NodeRecord
    | KVRecord
    | RemoveKV
    | CounterRecord
)
