"""BlockCache: decoded data blocks read from object storage, bounded by bytes, least recently
used evicted first. Keyed by (objectId, blockStartPosition)."""

from __future__ import annotations

from collections import OrderedDict

from storage.stream_record_batch import StreamRecordBatch


class BlockCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._blocks: OrderedDict[tuple[int, int], tuple[int, list[StreamRecordBatch]]] = (
            OrderedDict()
        )

    def get(self, object_id: int, position: int) -> list[StreamRecordBatch] | None:
        entry = self._blocks.get((object_id, position))
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._blocks.move_to_end((object_id, position))
        return entry[1]

    def put(
        self, object_id: int, position: int, size: int, batches: list[StreamRecordBatch]
    ) -> None:
        key = (object_id, position)
        old = self._blocks.pop(key, None)
        if old is not None:
            self.size -= old[0]
        if size > self.max_bytes:
            return
        self._blocks[key] = (size, batches)
        self.size += size
        while self.size > self.max_bytes:
            _, (evicted, _) = self._blocks.popitem(last=False)
            self.size -= evicted

    def clear(self) -> None:
        self._blocks.clear()
        self.size = 0
