"""Stream Object compaction planning (pure): merge a stream's small Stream Objects.

Per stream, Stream Objects that follow each other without a gap (one ends where the next
starts) are grouped, oldest first, while the group stays within
``s3.stream.object.compaction.max.size.bytes``; every group of two or more becomes one object.
A gap (offsets held by a Stream Set Object) ends a group: a Stream Object must hold every
offset of its range.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from storage.metadata.model import StreamMetadata, StreamObject


@dataclass(slots=True, frozen=True)
class StreamObjectGroup:
    """Stream Objects of one stream to merge into one, in offset order."""

    stream_id: int
    stream_epoch: int
    sources: tuple[StreamObject, ...]

    @property
    def start_offset(self) -> int:
        return self.sources[0].start_offset

    @property
    def end_offset(self) -> int:
        return self.sources[-1].end_offset

    @property
    def size(self) -> int:
        return sum(so.object_size for so in self.sources)


def plan_stream_object_compaction(
    streams: Iterable[StreamMetadata], max_size: int
) -> list[StreamObjectGroup]:
    """The groups to merge, by stream id then offset."""
    if max_size <= 0:
        raise ValueError(f"max size must be positive, got {max_size}")
    groups: list[StreamObjectGroup] = []
    for stream in sorted(streams, key=lambda s: s.stream_id):
        runs: list[list[StreamObject]] = [[]]
        size = 0
        for so in stream.stream_objects:
            if so.end_offset <= stream.start_offset:
                continue  # trimmed: the trim frees it
            current = runs[-1]
            joins = bool(current) and current[-1].end_offset == so.start_offset
            if not joins or size + so.object_size > max_size:
                runs.append([])
                size = 0
            if so.object_size < max_size:
                runs[-1].append(so)
                size += so.object_size
        groups += [
            StreamObjectGroup(stream.stream_id, stream.epoch, tuple(run))
            for run in runs
            if len(run) > 1
        ]
    return groups
