"""The JSON values of the MetaStream's ``LOG`` and ``PARTITION`` keys, byte-compatible with
AutoMQ's ``ElasticLogMeta``, ``ElasticStreamSegmentMeta`` and ``ElasticPartitionMeta`` (Jackson,
compact: no spaces, fields in declaration order).

``LOG`` (ElasticLogMeta)::

    {"streamMap":{"log":4,"tim":5,"txn":-1},"segmentMetas":[<segment>, ...]}

``streamMap`` maps a stream name (``log``, ``tim``, ``txn``, and ``log.cleaned``-style names
for compacted segments) to a stream id, -1 when the stream is not created yet. Its key order is
kept as read, new names go last.

Segment (ElasticStreamSegmentMeta), in this field order:

=====  ===============================  ==============================================
key    field                            meaning
=====  ===============================  ==============================================
bo     base_offset                      first Kafka offset of the segment
ct     create_timestamp                 ms when the segment was created
lmt    last_modified_timestamp          ms of the last append (0: none yet)
s      stream_suffix                    ``""``, or ``".cleaned"``: streams ``<name>.cleaned``
lsz    log_size                         bytes of record batches (an estimate after a crash)
ls     log                              slice ``{"s":start,"e":end}`` of the log stream
ts     time                             slice of the time index stream (bytes)
txs    txn                              slice of the transaction index stream
fbt    first_batch_timestamp            max timestamp of the first batch (0: none)
tle    time_index_last_entry            ``{"t":timestamp,"o":offset}``, initially (-1, bo)
=====  ===============================  ==============================================

A slice end of -1 marks the active segment: it reaches the stream's end.

``PARTITION`` (ElasticPartitionMeta)::

    {"s":startOffset,"c":cleanerOffset,"r":recoverOffset,"cs":cleanedShutdown}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from automq_py.log.meta_stream_record import InvalidMetaRecordError

NOOP_OFFSET = -1  # an unset slice bound, and the end of an active slice
NO_STREAM = -1  # a streamMap entry whose stream is not created yet
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP
CLEANED_SUFFIX = ".cleaned"
LOG_STREAM = "log"
TIME_STREAM = "tim"
TXN_STREAM = "txn"


class CorruptLogMetaError(RuntimeError):
    """The MetaStream's records do not describe a usable log."""


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(buf: bytes | memoryview, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(buf))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidMetaRecordError(f"{what}: not JSON: {e}") from e
    return _object(obj, what)


def _object(obj: object, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InvalidMetaRecordError(f"{what}: expected a JSON object, got {obj!r}")
    return obj


def _int(obj: Mapping[str, Any], key: str, default: int, what: str) -> int:
    value = obj.get(key, default)
    if value is None:  # Jackson writes a null Long as null; read it as the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMetaRecordError(f"{what}.{key}: expected an integer, got {value!r}")
    return value


@dataclass(slots=True, frozen=True)
class SliceRange:
    """A range ``[start, end)`` of a stream; ``end == -1`` reaches the stream's end."""

    start: int = NOOP_OFFSET
    end: int = NOOP_OFFSET

    @property
    def is_active(self) -> bool:
        return self.end == NOOP_OFFSET

    def to_json(self) -> dict[str, int]:
        return {"s": self.start, "e": self.end}

    @classmethod
    def from_json(cls, obj: object, what: str) -> SliceRange:
        o = _object(obj, what)
        return cls(_int(o, "s", NOOP_OFFSET, what), _int(o, "e", NOOP_OFFSET, what))


@dataclass(slots=True, frozen=True)
class TimestampOffset:
    """A time index entry: ``timestamp`` is first reached at (the batch ending at) ``offset``."""

    timestamp: int
    offset: int

    def to_json(self) -> dict[str, int]:
        return {"t": self.timestamp, "o": self.offset}

    @classmethod
    def from_json(cls, obj: object, what: str) -> TimestampOffset:
        o = _object(obj, what)
        return cls(_int(o, "t", 0, what), _int(o, "o", 0, what))


@dataclass(slots=True, frozen=True)
class ElasticStreamSegmentMeta:
    """One Kafka segment's place in the partition's streams (see the module table)."""

    base_offset: int = 0
    create_timestamp: int = 0
    last_modified_timestamp: int = 0
    stream_suffix: str = ""
    log_size: int = 0
    log: SliceRange = field(default_factory=SliceRange)
    time: SliceRange = field(default_factory=SliceRange)
    txn: SliceRange = field(default_factory=SliceRange)
    first_batch_timestamp: int = 0
    time_index_last_entry: TimestampOffset = field(default_factory=lambda: TimestampOffset(0, 0))

    @classmethod
    def new_active(
        cls, base_offset: int, create_timestamp: int, log: int, time: int, txn: int
    ) -> ElasticStreamSegmentMeta:
        """A fresh active segment starting at the given stream offsets (what AutoMQ writes
        when it creates a segment: ``lmt`` 0, ``fbt`` 0, ``tle`` (-1, base_offset))."""
        return cls(
            base_offset=base_offset,
            create_timestamp=create_timestamp,
            log=SliceRange(log, NOOP_OFFSET),
            time=SliceRange(time, NOOP_OFFSET),
            txn=SliceRange(txn, NOOP_OFFSET),
            time_index_last_entry=TimestampOffset(NO_TIMESTAMP, base_offset),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "bo": self.base_offset,
            "ct": self.create_timestamp,
            "lmt": self.last_modified_timestamp,
            "s": self.stream_suffix,
            "lsz": self.log_size,
            "ls": self.log.to_json(),
            "ts": self.time.to_json(),
            "txs": self.txn.to_json(),
            "fbt": self.first_batch_timestamp,
            "tle": self.time_index_last_entry.to_json(),
        }

    @classmethod
    def from_json(cls, obj: object, what: str = "segment") -> ElasticStreamSegmentMeta:
        o = _object(obj, what)
        suffix = o.get("s", "")
        if not isinstance(suffix, str):
            raise InvalidMetaRecordError(f"{what}.s: expected a string, got {suffix!r}")
        return cls(
            base_offset=_int(o, "bo", 0, what),
            create_timestamp=_int(o, "ct", 0, what),
            last_modified_timestamp=_int(o, "lmt", 0, what),
            stream_suffix=suffix,
            log_size=_int(o, "lsz", 0, what),
            log=SliceRange.from_json(o.get("ls", {}), f"{what}.ls"),
            time=SliceRange.from_json(o.get("ts", {}), f"{what}.ts"),
            txn=SliceRange.from_json(o.get("txs", {}), f"{what}.txs"),
            first_batch_timestamp=_int(o, "fbt", 0, what),
            time_index_last_entry=TimestampOffset.from_json(o.get("tle", {}), f"{what}.tle"),
        )


@dataclass(slots=True, frozen=True)
class ElasticLogMeta:
    """The ``LOG`` value: stream name -> stream id, and the segments in offset order."""

    stream_map: Mapping[str, int]
    segment_metas: tuple[ElasticStreamSegmentMeta, ...] = ()

    def stream_id(self, name: str) -> int:
        """The id of stream ``name``, or -1 when it is not created."""
        return self.stream_map.get(name, NO_STREAM)

    def encode(self) -> bytes:
        return _dumps(
            {
                "streamMap": dict(self.stream_map),
                "segmentMetas": [s.to_json() for s in self.segment_metas],
            }
        )

    @classmethod
    def decode(cls, buf: bytes | memoryview) -> ElasticLogMeta:
        o = _loads(buf, "LOG")
        streams = _object(o.get("streamMap", {}), "LOG.streamMap")
        stream_map = {name: _int(streams, name, NO_STREAM, "LOG.streamMap") for name in streams}
        segments = o.get("segmentMetas", [])
        if not isinstance(segments, list):
            raise InvalidMetaRecordError(f"LOG.segmentMetas: expected a list, got {segments!r}")
        metas = tuple(
            ElasticStreamSegmentMeta.from_json(s, f"LOG.segmentMetas[{i}]")
            for i, s in enumerate(segments)
        )
        return cls(stream_map, metas)


@dataclass(slots=True, frozen=True)
class ElasticPartitionMeta:
    """The ``PARTITION`` value: log start offset, cleaner and recovery points, clean shutdown."""

    start_offset: int = 0
    cleaner_offset: int = 0
    recover_offset: int = 0
    cleaned_shutdown: bool = False

    def encode(self) -> bytes:
        return _dumps(
            {
                "s": self.start_offset,
                "c": self.cleaner_offset,
                "r": self.recover_offset,
                "cs": self.cleaned_shutdown,
            }
        )

    @classmethod
    def decode(cls, buf: bytes | memoryview) -> ElasticPartitionMeta:
        o = _loads(buf, "PARTITION")
        cs = o.get("cs", False)
        if not isinstance(cs, bool):
            raise InvalidMetaRecordError(f"PARTITION.cs: expected a boolean, got {cs!r}")
        return cls(
            _int(o, "s", 0, "PARTITION"),
            _int(o, "c", 0, "PARTITION"),
            _int(o, "r", 0, "PARTITION"),
            cs,
        )
