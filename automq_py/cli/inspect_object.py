"""``automq-py inspect``: print an object's footer, index and (optionally) its records.

The output follows the lines of AutoMQ's own object dump::

    indexStartPosition: 5242006
    indexBlockLength: 252
    streamId=3, startOffset=4, endOffset=6, recordCount=2, startPosition=0, size=262
    objectId=78, ranges=[3:4-6, 4:50390-55430, 5:8376-9384, ]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterable
from typing import Any

from automq_py.log import meta_stream_record
from protocol import record_batch
from storage import object_format
from storage.object_format import CorruptObjectError, DataBlockIndex, Footer
from storage.operator import open_object_store
from storage.operator.base import ObjectNotFoundError, ObjectStoreError
from storage.stream_record_batch import StreamRecordBatch


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "inspect",
        help="print an S3Stream object's footer, index and records",
        description=(
            "Decode an object in AutoMQ's format: footer, one line per index entry and the "
            "per-stream ranges; with --records every StreamRecordBatch, Kafka record batch "
            "headers and MetaStream key-values."
        ),
    )
    p.add_argument(
        "object",
        help="a local file holding an object, or a key in the store given by --store",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        help="object store holding the key: file:///dir or s3://bucket?endpoint=..&region=..",
    )
    p.add_argument(
        "--object-id",
        type=int,
        default=None,
        help="object id to print (default: the number at the end of the key or file name)",
    )
    p.add_argument("--records", action="store_true", help="also decode every record batch")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        for line in asyncio.run(_inspect(args)):
            print(line)
    except (CorruptObjectError, ObjectNotFoundError, ObjectStoreError, OSError) as e:
        print(f"automq-py inspect: {args.object}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0


class _FileSource:
    """Ranged reads of a plain local file, the same shape as an object store's ``get``."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def size(self, _key: str) -> int:
        return os.path.getsize(self.path)

    async def get(self, _key: str, start: int = 0, end: int | None = None) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(-1 if end is None else max(0, end - start))

    async def close(self) -> None:
        return None


async def _inspect(args: argparse.Namespace) -> list[str]:
    source: Any = open_object_store(args.store) if args.store else _FileSource(args.object)
    try:
        size = await source.size(args.object)
        tail = await source.get(args.object, max(0, size - object_format.FOOTER_SIZE), size)
        footer = object_format.decode_footer(tail, size)
        raw_index = await source.get(
            args.object,
            footer.index_start_position,
            footer.index_start_position + footer.index_block_length,
        )
        index = object_format.decode_index(raw_index)
        object_id = args.object_id if args.object_id is not None else _id_from_name(args.object)
        lines = describe_index(footer, index, object_id)
        if args.records:
            for entry in index:
                data = await source.get(args.object, entry.start_position, entry.end_position)
                if len(data) != entry.size:
                    raise CorruptObjectError(
                        f"block at {entry.start_position} is truncated: {len(data)} of "
                        f"{entry.size} bytes"
                    )
                batches, _ = object_format.decode_block(data)
                lines.extend(describe_records(batches))
        return lines
    finally:
        await source.close()


def _id_from_name(name: str) -> int:
    last = os.path.basename(name.rstrip("/"))
    return int(last) if last.isdigit() else -1


def describe_index(footer: Footer, index: list[DataBlockIndex], object_id: int) -> list[str]:
    """The footer, one line per index entry, and the ``objectId=…, ranges=[…]`` summary."""
    lines = [
        f"indexStartPosition: {footer.index_start_position}",
        f"indexBlockLength: {footer.index_block_length}",
    ]
    for e in index:
        lines.append(
            f"streamId={e.stream_id}, startOffset={e.start_offset}, endOffset={e.end_offset}, "
            f"recordCount={e.record_count}, startPosition={e.start_position}, size={e.size}"
        )
    ranges = "".join(f"{r}, " for r in object_format.stream_ranges(index))
    lines.append(f"objectId={object_id}, ranges=[{ranges}]")
    return lines


def describe_records(batches: Iterable[StreamRecordBatch]) -> list[str]:
    """Each StreamRecordBatch, and what its payload holds when that is recognisable."""
    lines: list[str] = []
    for b in batches:
        lines.append("===========")
        lines.append(
            f"StreamRecordBatch{{streamId={b.stream_id}, epoch={b.epoch}, "
            f"baseOffset={b.base_offset}, count={b.count}, size={len(b.payload)}}}"
        )
        detail = describe_payload(b.payload)
        if detail:
            lines.append(detail)
    return lines


def describe_payload(payload: bytes | memoryview) -> str | None:
    """A Kafka record batch header, a MetaStream key-value, or None."""
    if record_batch.looks_like_batch(payload):
        try:
            h = record_batch.parse_header(payload)
        except record_batch.InvalidRecordBatchError:
            return None
        crc_ok = record_batch.crc_is_valid(payload, h)
        return (
            f"checksum={h.crc}{'' if crc_ok else ' (INVALID)'}, baseOffset={h.base_offset}, "
            f"maxTimestamp={h.max_timestamp}, timestampType={h.timestamp_type}, "
            f"lastOffset={h.last_offset}, nextOffset={h.last_offset + 1}, magic={h.magic}, "
            f"producerId={h.producer_id}, producerEpoch={h.producer_epoch}, "
            f"baseSequence={h.base_sequence}, lastSequence={h.last_sequence}, "
            f"compressionType={h.compression}, sizeInBytes={h.size}, "
            f"partitionLeaderEpoch={h.partition_leader_epoch}, "
            f"isControlBatch={str(h.is_control).lower()}, "
            f"isTransactional={str(h.is_transactional).lower()}"
        )
    try:
        kv = meta_stream_record.decode(payload)
    except meta_stream_record.InvalidMetaRecordError:
        return None
    if kv.key not in meta_stream_record.KNOWN_KEYS:
        return None
    return f"key={kv.key}, value={meta_stream_record.describe_value(kv.key, kv.value)}"
