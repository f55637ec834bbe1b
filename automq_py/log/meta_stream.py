"""MetaStream: key-value semantics over a stream of MetaStream records (AutoMQ's ``MetaStream``).

Every :meth:`MetaStream.put` appends one record (see :mod:`automq_py.log.meta_stream_record`);
:meth:`MetaStream.replay` reads the stream from its start and keeps the last record per key.
Superseded records are dropped by compaction: the current value of every key is appended again
and the stream is trimmed before the first of those copies, so a crash at any point still
leaves every key's latest value in the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from automq_py.log import meta_stream_record
from automq_py.log.meta_stream_record import InvalidMetaRecordError, MetaKeyValue
from storage.stream import S3Stream

log = logging.getLogger(__name__)

COMPACTION_THRESHOLD = 128  # superseded records that trigger a compaction
REPLAY_FETCH_BYTES = 64 * 1024


class MetaStream:
    """The key-value view of one partition's MetaStream."""

    def __init__(self, stream: S3Stream, *, compaction_threshold: int = COMPACTION_THRESHOLD):
        self.stream = stream
        self.compaction_threshold = compaction_threshold
        self._values: dict[str, bytes] = {}
        self._offsets: dict[str, int] = {}  # key -> stream offset of its latest record
        self._superseded = 0  # records in the stream that a later one replaced
        # one write at a time: a compaction must not re-append a value a concurrent put replaced
        self._write_lock = asyncio.Lock()
        self._last_write: asyncio.Future[None] | None = None  # the last record's durability

    @property
    def stream_id(self) -> int:
        return self.stream.stream_id

    @property
    def superseded_records(self) -> int:
        """Records in the stream whose key has a later record: what compaction removes."""
        return self._superseded

    def get(self, key: str) -> bytes | None:
        """The latest value of ``key`` (after :meth:`replay` or :meth:`put`), None if unset."""
        return self._values.get(key)

    def items(self) -> dict[str, bytes]:
        """A copy of every key's latest value."""
        return dict(self._values)

    async def replay(self) -> dict[str, bytes]:
        """Read the whole stream; the last record per key wins. Returns key -> value.

        An undecodable record is logged and skipped, as AutoMQ does, so one bad write does not
        make the partition unopenable.
        """
        self._values.clear()
        self._offsets.clear()
        records = 0
        pos = self.stream.start_offset
        end = self.stream.confirmed_offset
        while pos < end:
            result = await self.stream.fetch(pos, end, REPLAY_FETCH_BYTES)
            if not result.batches:
                raise InvalidMetaRecordError(
                    f"MetaStream {self.stream_id}: no records at {pos} below its end {end}"
                )
            for batch in result.batches:
                pos = batch.last_offset
                try:
                    kv = meta_stream_record.decode(batch.payload)
                except InvalidMetaRecordError as e:
                    log.error(
                        "MetaStream %d: skipping the record at %d: %s",
                        self.stream_id,
                        batch.base_offset,
                        e,
                    )
                    continue
                records += 1
                self._values[kv.key] = kv.value
                self._offsets[kv.key] = batch.base_offset
        self._superseded = records - len(self._values)
        return dict(self._values)

    async def put(self, key: str, value: bytes) -> None:
        """Append ``key = value``; durable when this returns (at once when the key already
        durably holds that value: a partition closing writes its unchanged metas again, 10,000
        partitions closing, tens of thousands of appends). May compact the stream."""
        await self.put_many(((key, value),))

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Append several ``key = value`` records, in order, as one write: they join one WAL
        group commit and one wait, where :meth:`put` after :meth:`put` waits for each (a
        broker opening thousands of partitions writes each one's records together). Durable
        when this returns; values a key already holds are not written again.

        The values are this MetaStream's from the moment their records are appended, before
        they are durable: a caller cancelled while it waits leaves its records in the stream,
        and a later compaction must copy them, not the values they replaced (which, copied
        after them, would win the next replay). A later call that finds its values already
        held waits for that write to be durable."""
        async with self._write_lock:
            changed = [(key, value) for key, value in items if self._values.get(key) != value]
            if not changed:
                await self._durable()
                return
            await self.stream.wait_for_room()
            durable: asyncio.Future[None] | None = None
            for key, value in changed:
                encoded = meta_stream_record.encode(MetaKeyValue(key, value))
                offset, durable = self.stream.append_now(encoded, 1)
                if key in self._offsets:
                    self._superseded += 1
                self._values[key] = value
                self._offsets[key] = offset
            self._last_write = durable
            await self._durable()
            if self._superseded >= self.compaction_threshold:
                await self._compact()

    async def _durable(self) -> None:
        """Wait until the last record appended is durable (and so every earlier one)."""
        last = self._last_write
        if last is None or (last.done() and not last.cancelled() and last.exception() is None):
            return
        await asyncio.shield(last)  # the write goes on if this caller is cancelled

    async def compact(self) -> None:
        """Re-append every key's current value, then trim the stream before those copies."""
        async with self._write_lock:
            await self._compact()

    async def _compact(self) -> None:
        if not self._values:
            return
        trim_to = self.stream.next_offset
        for key, value in list(self._values.items()):
            encoded = meta_stream_record.encode(MetaKeyValue(key, value))
            self._offsets[key] = await self.stream.append(encoded, 1)
        await self.stream.trim(trim_to)
        self._superseded = 0
        log.debug("MetaStream %d compacted: trimmed to %d", self.stream_id, trim_to)

    async def close(self) -> None:
        """Compact when anything is superseded (as AutoMQ does on close), then close."""
        async with self._write_lock:
            if not self.stream.closed and self._superseded > 0:
                await self._compact()
            await self.stream.close()
