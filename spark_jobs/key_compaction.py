"""The key-compaction unit: one partition's cleaning, on an executor.

The unit reads the partition's range through the broker (read_committed Fetches: the raw
batches and the aborted transactions among them, data still in the WAL included), cleans it
with :mod:`storage.compaction.key_compaction` and returns the kept batches to the driver, which
commits them (CommitCleanedSegment). Reading through the broker keeps the unit to one
connection and no S3 credentials; the cleaning itself, the part that costs, runs here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from automq_py.log.txn_index import AbortedTxn
from protocol import control_records, record_batch
from protocol.records import parse_records
from spark_jobs.controller_client import ControllerClient
from storage.compaction import key_compaction
from storage.compaction.cleanable import CleanUnit

MARKER_NOT_READ = (1 << 63) - 1  # an aborted transaction whose ABORT lies past the range


@dataclass(slots=True, frozen=True)
class KeyCompactionUnit:
    """Clean ``clean`` of the broker at ``bootstrap``, at the controller's time ``now_ms``."""

    bootstrap: str
    clean: CleanUnit
    now_ms: int


@dataclass(slots=True, frozen=True)
class KeyCompactionResult:
    unit: KeyCompactionUnit
    batches: tuple[tuple[int, bytes], ...]  # (stream offsets covered, batch bytes)
    aborted: tuple[tuple[int, int, int], ...]  # kept ABORTs' (producer id, first, marker offset)
    records_in: int
    records_kept: int
    bytes_in: int


def clean_partition(unit: KeyCompactionUnit) -> KeyCompactionResult:
    """Read, clean and return one partition's range (runs on an executor)."""
    return asyncio.run(_clean(unit))


async def _clean(unit: KeyCompactionUnit) -> KeyCompactionResult:
    c = unit.clean
    batches, aborted_firsts = await read_range(
        unit.bootstrap, c.topic, c.partition, c.base_offset, c.end_offset
    )
    aborted = resolve_aborted(batches, aborted_firsts)
    offset_map = key_compaction.build_offset_map(batches, aborted=aborted, up_to=c.end_offset)
    cleaned = key_compaction.clean_batches(
        batches,
        offset_map,
        segment_base=c.base_offset,
        clean_up_to=c.end_offset,
        aborted=aborted,
        delete_retention_ms=c.delete_retention_ms,
        now_ms=unit.now_ms,
        active_producers=key_compaction.last_records_of_producers(batches),
    )
    if cleaned.end_offset != c.end_offset:
        raise RuntimeError(
            f"{c.topic}-{c.partition}: the cleaned batches end at {cleaned.end_offset}, "
            f"not at the range's end {c.end_offset}"
        )
    stats = cleaned.stats
    return KeyCompactionResult(
        unit,
        tuple((b.count, b.data) for b in cleaned.batches),
        tuple((a.producer_id, a.first_offset, a.last_offset) for a in cleaned.aborted_txns),
        stats.records_read,
        stats.records_kept,
        stats.bytes_read,
    )


async def read_range(
    bootstrap: str, topic: str, partition: int, start: int, end: int
) -> tuple[list[memoryview], set[tuple[int, int]]]:
    """The batches of ``[start, end)`` (whole batches, in order) and the aborted transactions
    among them as ``(producer id, first offset)``."""
    batches: list[memoryview] = []
    aborted: set[tuple[int, int]] = set()
    offset = start
    async with await ControllerClient.connect(bootstrap) as client:
        while offset < end:
            got = await client.fetch_batches(topic, partition, offset)
            aborted.update(got.aborted)
            before = offset
            for header, view in record_batch.iter_batches(got.records):
                if header.base_offset >= end:
                    offset = end
                    break
                if header.last_offset < offset:
                    continue  # a batch read already (a fetch starts at the batch holding offset)
                batches.append(view)
                offset = header.last_offset + 1
            if offset == before:
                raise RuntimeError(
                    f"{topic}-{partition}: nothing readable at offset {offset} (range "
                    f"[{start}, {end}), stable offset {got.last_stable_offset})"
                )
    return batches, aborted


def resolve_aborted(batches: list[memoryview], firsts: set[tuple[int, int]]) -> list[AbortedTxn]:
    """The aborted transactions with their ABORT markers' offsets, from the batches read."""
    markers: dict[int, list[int]] = {}  # producer id -> offsets of its ABORT markers
    for view in batches:
        header = record_batch.parse_header(view)
        if not header.is_control:
            continue
        records = parse_records(view, check_crc=False)
        if not records:
            continue
        try:
            marker = control_records.decode_marker(records[0].key, records[0].value)
        except ValueError:
            continue
        if not marker.is_commit:
            markers.setdefault(header.producer_id, []).append(header.base_offset)
    out = []
    for pid, first in sorted(firsts, key=lambda t: t[1]):
        last = next((o for o in markers.get(pid, ()) if o > first), MARKER_NOT_READ)
        out.append(AbortedTxn(pid, first, last, -1))
    return out
