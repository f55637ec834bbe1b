"""The leader epoch cache (Kafka's ``LeaderEpochFileCache``) as plain data: which leader epoch
started at which offset. No I/O: :class:`~automq_py.log.elastic_log.ElasticLog` stores it under
``LEADER_EPOCH_CHECKPOINT``.
"""

from __future__ import annotations

from automq_py.log.meta_stream_record import LeaderEpochCheckpoint

CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    """``(epoch, start offset)`` entries, both strictly increasing."""

    def __init__(self, entries: tuple[tuple[int, int], ...] = ()) -> None:
        self._entries = list(entries)

    @property
    def entries(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    def checkpoint(self) -> LeaderEpochCheckpoint:
        return LeaderEpochCheckpoint(CHECKPOINT_VERSION, self.entries)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; entries it contradicts (an epoch
        as new or newer, or a start offset as late or later) are dropped. Returns whether
        anything changed: reassigning the latest epoch at a later offset does nothing."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch {epoch} at offset {start_offset}: both must be >= 0")
        if self._entries:
            last_epoch, last_start = self._entries[-1]
            if epoch == last_epoch and start_offset >= last_start:
                return False
        while self._entries and (
            self._entries[-1][0] >= epoch or self._entries[-1][1] >= start_offset
        ):
            self._entries.pop()
        self._entries.append((epoch, start_offset))
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset``: the epoch in force there starts there."""
        removed = 0
        while removed < len(self._entries) and self._entries[removed][1] <= start_offset:
            removed += 1
        if removed == 0:
            return False
        epoch, old_start = self._entries[removed - 1]
        del self._entries[:removed]
        self._entries.insert(0, (epoch, start_offset))
        return old_start != start_offset or removed > 1

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch in force at ``offset`` (Kafka's ``epochForOffset``): the last entry that
        starts at or before it; undefined (-1) before the first."""
        found = UNDEFINED_EPOCH
        for epoch, start in self._entries:
            if start > offset:
                break
            found = epoch
        return found

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end offset)`` for OffsetForLeaderEpoch (Kafka's ``endOffsetFor``): the
        largest known epoch <= ``epoch`` and the start offset of the next one, the log end for
        the latest epoch; undefined (-1, -1) past the latest."""
        if epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._entries[-1][0]:
            return epoch, log_end_offset
        higher = next((i for i, (e, _) in enumerate(self._entries) if e > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        next_start = self._entries[higher][1]
        if higher == 0:
            return epoch, next_start
        return self._entries[higher - 1][0], next_start
