"""Upload planning (pure): how a sealed LogCache block becomes objects.

Per stream, a run of at least ``s3.stream.object.split.size`` bytes becomes its own Stream
Object; every other run goes, in (streamId, offset) order, into one Stream Set Object. So one
upload costs one PUT for all small streams together, plus one per large stream: the PUT count
follows the bytes written, not the number of streams.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from storage.object_writer import BuiltObject, ObjectWriter
from storage.stream_record_batch import StreamRecordBatch


@dataclass(slots=True, frozen=True)
class UploadPlan:
    stream_set: list[Sequence[StreamRecordBatch]]
    stream_objects: list[Sequence[StreamRecordBatch]]

    @property
    def object_count(self) -> int:
        return len(self.stream_objects) + (1 if self.stream_set else 0)


def plan_upload(
    records: Mapping[int, Sequence[StreamRecordBatch]],
    split_size: int,
    sizes: dict[int, int] | None = None,
) -> UploadPlan:
    """``sizes``: each stream's bytes, when the caller keeps them (summed here otherwise; a
    sum over thousands of batches takes milliseconds of the event loop)."""
    stream_set: list[Sequence[StreamRecordBatch]] = []
    stream_objects: list[Sequence[StreamRecordBatch]] = []
    for stream_id in sorted(records):
        run = records[stream_id]
        if not run:
            continue
        size = sizes[stream_id] if sizes is not None else sum(r.size for r in run)
        if size >= split_size:
            stream_objects.append(run)
        else:
            stream_set.append(run)
    return UploadPlan(stream_set, stream_objects)


def build_object(runs: list[Sequence[StreamRecordBatch]], block_size: int) -> BuiltObject:
    """Lay out runs (already in stream order) as one object."""
    writer = ObjectWriter(block_size)
    for run in runs:
        writer.add_all(run)
    return writer.finish()
