"""Idempotent batches a broker refused before appending them, remembered until they come again.

A partition that knows nothing of a producer takes any sequence from it (KIP-360: its state may
have expired). That opens a hole when a producer's batch at sequence ``s`` is refused with an
error the client retries (this broker does not lead the partition yet, has not opened it yet,
does not know the topic yet, had no room in time) and its next batch, already on its way,
arrives once the partition is ready: appended, it leaves ``s`` out, and a client that sees a
later batch acknowledged takes the earlier ones as written (librdkafka acknowledges them
implicitly, with no offset): acknowledged records lost.

Kafka's sequence check refuses such a batch once the partition knows the producer. For a
producer it does not know, this memory does: a later batch of the same producer epoch gets the
answer the refused one got, until the refused one comes again (its retry), the producer moves
to a newer epoch, or the partition knows the producer (its batch landed through another
broker). Entries are forgotten after :data:`MEMORY_S` (a client retries a batch within its
delivery timeout, librdkafka's ``message.timeout.ms`` 300 s by default and the Java client's
``delivery.timeout.ms`` 120 s, or gives it up and bumps its epoch) and beyond
:data:`MAX_ENTRIES`, oldest first.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from protocol.errors import ErrorCode
from protocol.record_batch import InvalidRecordBatchError, RecordBatchHeader, parse_header

MEMORY_S = 300.0
MAX_ENTRIES = 10_000

# the refusals after which a client sends the batch again, which was not appended
RETRIED = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
    }
)

PartitionKey = tuple[str, int]


@dataclass(slots=True)
class _Refusal:
    epoch: int
    sequence: int  # the refused batch's first sequence
    code: ErrorCode
    at: float


def _idempotent_header(records: memoryview | bytes) -> RecordBatchHeader | None:
    """The first batch's header when it carries a producer id and a sequence."""
    try:
        header = parse_header(records)
    except (InvalidRecordBatchError, ValueError):
        return None
    if header.producer_id < 0 or header.base_sequence < 0:
        return None
    return header


class RefusedBatches:
    """See the module docstring."""

    def __init__(
        self,
        *,
        memory_s: float = MEMORY_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._memory_s = memory_s
        self._max_entries = max_entries
        self._clock = clock
        # (partition, producer id) -> its refusal, oldest first
        self._entries: OrderedDict[tuple[PartitionKey, int], _Refusal] = OrderedDict()
        self._partitions: Counter[PartitionKey] = Counter()  # entries per partition

    def __len__(self) -> int:
        return len(self._entries)

    def refused(
        self, partition: PartitionKey, records: memoryview | bytes, code: ErrorCode
    ) -> None:
        """A Produce's ``records`` for ``partition`` were answered ``code`` and not appended."""
        if code not in RETRIED:
            return
        header = _idempotent_header(records)
        if header is None:
            return
        key = (partition, header.producer_id)
        now = self._clock()
        found = self._entries.get(key)
        if (
            found is not None
            and now - found.at < self._memory_s
            and found.epoch == header.producer_epoch
            and found.sequence < header.base_sequence
        ):
            return  # an earlier batch of this epoch is still owed
        if found is None:
            self._partitions[partition] += 1
        else:
            del self._entries[key]  # re-inserted as the newest
        self._entries[key] = _Refusal(header.producer_epoch, header.base_sequence, code, now)
        self._trim(now)

    def held_back(
        self,
        partition: PartitionKey,
        records: memoryview | bytes,
        knows_producer: Callable[[int], bool],
    ) -> ErrorCode | None:
        """The answer for ``records`` about to be appended to ``partition``: the refusal an
        earlier batch of theirs got, while that one is owed; else None (go ahead).
        ``knows_producer(producer_id)``: whether the partition holds state for it."""
        if partition not in self._partitions:
            return None
        header = _idempotent_header(records)
        if header is None:
            return None
        key = (partition, header.producer_id)
        found = self._entries.get(key)
        if found is None:
            return None
        owed = (
            self._clock() - found.at < self._memory_s
            and header.producer_epoch == found.epoch
            and header.base_sequence > found.sequence
            and not knows_producer(header.producer_id)
        )
        if owed:
            return found.code
        self._forget(key)
        return None

    def _forget(self, key: tuple[PartitionKey, int]) -> None:
        del self._entries[key]
        partition = key[0]
        self._partitions[partition] -= 1
        if not self._partitions[partition]:
            del self._partitions[partition]

    def _trim(self, now: float) -> None:
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if len(self._entries) <= self._max_entries and now - oldest.at < self._memory_s:
                return
            self._forget(key)
