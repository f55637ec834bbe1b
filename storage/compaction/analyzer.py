"""Stream Set Object compaction planning (pure), after AutoMQ's ``CompactionAnalyzer`` (seed 002).

Input: a node's Stream Set Objects with their indexes, and each stream's start offset. Output:
iterations, each reading at most ``cache_size`` bytes of data blocks, that together write

* one **Stream Object** per contiguous run of a stream holding at least ``split_size`` bytes
  (a run cut by an iteration boundary gives one Stream Object per iteration);
* one new **Stream Set Object** with everything else, in (stream, offset) order, written as
  parts across the iterations;
* for each *force-split* source (older than ``s3.stream.set.object.compaction.force.split.
  minutes``), one Stream Object per run of a stream in it, whatever its size, so that old data
  never stays mixed with other streams.

Blocks of deleted streams, and blocks wholly below their stream's start offset, are dropped. A
block that holds a stream's start offset is read whole and its batches below the start are left
out of the output (``CompactionPlan.start_offsets``): a block rewritten by an earlier compaction
can hold much of a stream, and retention must not wait for all of it to expire.
Each iteration's reads are grouped per source object and adjacent blocks merged into one ranged
GET. A block larger than ``cache_size`` gets an iteration of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from storage.object_format import DataBlockIndex

SSO = "sso"
SO = "so"


@dataclass(slots=True, frozen=True)
class SourceObject:
    """A Stream Set Object to compact: its metadata and its index (read from its footer)."""

    object_id: int
    object_size: int
    order_id: int
    data_time_ms: int
    index: tuple[DataBlockIndex, ...]


@dataclass(slots=True, frozen=True)
class PlannedBlock:
    """A data block to move: where it lies (source object) and what it holds."""

    object_id: int
    block: DataBlockIndex

    @property
    def size(self) -> int:
        return self.block.size


@dataclass(slots=True, frozen=True)
class ReadRange:
    """One ranged GET: bytes ``[start, end)`` of a source object, covering adjacent blocks."""

    object_id: int
    start: int
    end: int
    blocks: tuple[PlannedBlock, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(slots=True, frozen=True)
class PlannedOutput:
    """What one iteration writes to one new object: a Stream Object (``kind`` "so") whole, or
    a part of the new Stream Set Object ("sso"). ``blocks`` are in (stream, offset) order."""

    kind: str
    blocks: tuple[PlannedBlock, ...]

    @property
    def stream_id(self) -> int:
        return self.blocks[0].block.stream_id

    @property
    def start_offset(self) -> int:
        return self.blocks[0].block.start_offset

    @property
    def end_offset(self) -> int:
        return self.blocks[-1].block.end_offset

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blocks)


@dataclass(slots=True, frozen=True)
class Iteration:
    reads: tuple[ReadRange, ...]
    outputs: tuple[PlannedOutput, ...]

    @property
    def size(self) -> int:
        return sum(r.size for r in self.reads)


@dataclass(slots=True, frozen=True)
class CompactionPlan:
    """One compaction run of a node's Stream Set Objects, committed at once."""

    compacted_object_ids: tuple[int, ...]
    iterations: tuple[Iteration, ...]
    dropped_bytes: int  # of deleted or trimmed streams (estimated for blocks cut at a start)
    # streams with a block that holds their start offset: batches ending at or below it go
    start_offsets: Mapping[int, int] = field(default_factory=dict)

    @property
    def stream_object_count(self) -> int:
        return sum(1 for it in self.iterations for o in it.outputs if o.kind == SO)

    @property
    def has_stream_set_object(self) -> bool:
        return any(o.kind == SSO for it in self.iterations for o in it.outputs)

    @property
    def object_count(self) -> int:
        """New objects the run writes (ids to prepare)."""
        return self.stream_object_count + (1 if self.has_stream_set_object else 0)

    @property
    def read_bytes(self) -> int:
        return sum(it.size for it in self.iterations)

    @property
    def get_count(self) -> int:
        """Ranged GETs issued, adjacent blocks merged."""
        return sum(len(it.reads) for it in self.iterations)

    @property
    def block_count(self) -> int:
        """Blocks read: the GETs a reader issuing one per block would make."""
        return sum(len(r.blocks) for it in self.iterations for r in it.reads)


def select_sources(
    objects: Sequence[SourceObject], max_num: int
) -> tuple[list[SourceObject], list[SourceObject]]:
    """The oldest ``max_num`` objects (order_id order) to compact now, and the rest."""
    ordered = sorted(objects, key=lambda o: (o.order_id, o.object_id))
    return ordered[:max_num], ordered[max_num:]


def plan_compaction(
    sources: Sequence[SourceObject],
    start_offsets: Mapping[int, int],
    *,
    split_size: int,
    cache_size: int,
    force_split_before_ms: int = -1,
) -> CompactionPlan | None:
    """Plan the compaction of ``sources`` (all of one node), or None when it gains nothing.

    ``start_offsets`` maps each live stream to its start offset; streams missing from it were
    deleted. Sources whose data time is before ``force_split_before_ms`` are force-split.
    """
    if split_size <= 0 or cache_size <= 0:
        raise ValueError(f"split size and cache size must be positive: {split_size}, {cache_size}")
    dropped = 0
    merged: list[PlannedBlock] = []
    split: list[list[PlannedBlock]] = []
    cut: dict[int, int] = {}
    for source in sources:
        kept, gone = _live_blocks(source, start_offsets, cut)
        dropped += gone
        if source.data_time_ms < force_split_before_ms:
            split.extend(_runs(kept))
        else:
            merged.extend(kept)
    merged.sort(key=lambda b: (b.block.stream_id, b.block.start_offset))
    pieces: list[tuple[str, list[PlannedBlock]]] = [(SO, run) for run in split]
    for run in _runs(merged):
        pieces.append((SO if sum(b.size for b in run) >= split_size else SSO, run))
    pieces.sort(key=lambda p: (p[1][0].block.stream_id, p[1][0].block.start_offset))
    if not _worth_it(sources, pieces, dropped):
        return None
    return CompactionPlan(
        compacted_object_ids=tuple(s.object_id for s in sources),
        iterations=tuple(_iterations(pieces, cache_size)),
        dropped_bytes=dropped,
        start_offsets=cut,
    )


def _live_blocks(
    source: SourceObject, start_offsets: Mapping[int, int], cut: dict[int, int]
) -> tuple[list[PlannedBlock], int]:
    """The blocks of ``source`` holding data at or above their stream's start, and the bytes
    left out (whole blocks, plus an estimate by offsets for blocks cut at the start; those
    streams go into ``cut``)."""
    kept: list[PlannedBlock] = []
    dropped = 0
    for block in source.index:
        start = start_offsets.get(block.stream_id)
        if start is None or block.end_offset <= start:
            dropped += block.size
            continue
        kept.append(PlannedBlock(source.object_id, block))
        if block.start_offset < start:
            cut[block.stream_id] = start
            span = max(block.end_offset_delta, 1)
            dropped += block.size * (start - block.start_offset) // span
    return kept, dropped


def _runs(blocks: Iterable[PlannedBlock]) -> list[list[PlannedBlock]]:
    """Blocks (sorted by stream, offset) cut where the stream changes or offsets jump."""
    runs: list[list[PlannedBlock]] = []
    for b in blocks:
        last = runs[-1][-1].block if runs else None
        if (
            last is not None
            and last.stream_id == b.block.stream_id
            and last.end_offset == b.block.start_offset
        ):
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def _worth_it(
    sources: Sequence[SourceObject], pieces: Sequence[tuple[str, list[PlannedBlock]]], dropped: int
) -> bool:
    """A single source that would be rewritten as it is is left alone, and so is one that would
    lose under a tenth of its bytes (a rewrite per retention step would cost more)."""
    if len(sources) > 1 or (sources and dropped * 10 >= sources[0].object_size):
        return True
    return any(kind == SO for kind, _ in pieces)


def _iterations(
    pieces: Sequence[tuple[str, list[PlannedBlock]]], cache_size: int
) -> list[Iteration]:
    """Fill iterations up to ``cache_size`` in piece order, cutting pieces between blocks."""
    iterations: list[Iteration] = []
    outputs: list[PlannedOutput] = []
    used = 0

    def close() -> None:
        nonlocal outputs, used
        if outputs:
            iterations.append(Iteration(_reads(outputs), _merge_sso_outputs(outputs)))
        outputs, used = [], 0

    for kind, run in pieces:
        current: list[PlannedBlock] = []
        for b in run:
            if used + b.size > cache_size and (outputs or current):
                if current:
                    outputs.append(PlannedOutput(kind, tuple(current)))
                    current = []
                close()
            current.append(b)
            used += b.size
        if current:
            outputs.append(PlannedOutput(kind, tuple(current)))
    close()
    return iterations


def _merge_sso_outputs(outputs: Sequence[PlannedOutput]) -> tuple[PlannedOutput, ...]:
    """An iteration writes one part of the new Stream Set Object, however many runs feed it;
    the part is listed where its first run falls among the Stream Objects."""
    sso_blocks = tuple(b for o in outputs if o.kind == SSO for b in o.blocks)
    out: list[PlannedOutput] = []
    for o in outputs:
        if o.kind == SO:
            out.append(o)
        elif sso_blocks:
            out.append(PlannedOutput(SSO, sso_blocks))
            sso_blocks = ()
    return tuple(out)


def _reads(outputs: Sequence[PlannedOutput]) -> tuple[ReadRange, ...]:
    """The iteration's blocks grouped per source object, adjacent ones merged into one GET."""
    blocks = sorted(
        (b for o in outputs for b in o.blocks),
        key=lambda b: (b.object_id, b.block.start_position),
    )
    reads: list[ReadRange] = []
    for object_id, group in itertools.groupby(blocks, key=lambda b: b.object_id):
        run: list[PlannedBlock] = []
        for b in group:
            if run and run[-1].block.end_position != b.block.start_position:
                reads.append(_read(object_id, run))
                run = []
            run.append(b)
        if run:
            reads.append(_read(object_id, run))
    return tuple(reads)


def _read(object_id: int, run: Sequence[PlannedBlock]) -> ReadRange:
    return ReadRange(object_id, run[0].block.start_position, run[-1].block.end_position, tuple(run))
