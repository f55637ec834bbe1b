"""Idempotent batches a broker refused before appending them, remembered until they come again.

A producer's batch at sequence ``s`` refused with an error the client retries (this broker does
not lead the partition yet, has not opened it yet, does not know the topic yet, had no room in
time) is not in the log, while the producer's next batch, already on its way, may arrive once
the partition is ready. Two things then go wrong:

* a partition that knows nothing of the producer takes any sequence from it (KIP-360: its state
  may have expired): appended, the later batch leaves ``s`` out, and a client that sees a later
  batch acknowledged takes the earlier ones as written (librdkafka acknowledges them
  implicitly, with no offset): acknowledged records lost;
* a partition that knows the producer answers the later batch OUT_OF_ORDER_SEQUENCE_NUMBER
  (Kafka's sequence check), which librdkafka takes for lost sequence numbers: it bumps the
  producer's epoch and sends every partition's unacknowledged batches again from sequence 0 of
  the new epoch, so a batch some partition had written, whose acknowledgement the client had
  not got, is written twice.

So a later batch of the same producer epoch gets the answer the refused one got, a retriable
one, until the refused one comes again (its retry), the producer moves to a newer epoch, or the
partition's state shows the refused batch landed (its last sequence there at or past ``s`` in
that epoch: it was written through the broker that led the partition then; a state of an older
epoch shows nothing of the new one). A batch before ``s``, or of an older epoch, goes ahead to
Kafka's own checks, and leaves the refusal as it was.
Entries are forgotten after :data:`MEMORY_S` (a client retries a batch within its delivery
timeout, librdkafka's ``message.timeout.ms`` 300 s by default and the Java client's
``delivery.timeout.ms`` 120 s, or gives it up and bumps its epoch) and beyond
:data:`MAX_ENTRIES`, oldest first.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from automq_py.producer_state import ProducerStateEntry
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
            and (found.epoch, -found.sequence) > (header.producer_epoch, -header.base_sequence)
        ):
            return  # an earlier batch of this epoch, or one of a newer epoch, is still owed
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
        producer_at: Callable[[int], ProducerStateEntry | None],
    ) -> ErrorCode | None:
        """The answer for ``records`` about to be appended to ``partition``: the refusal an
        earlier batch of theirs got, while that one is owed; else None (go ahead).
        ``producer_at(producer_id)``: the partition's state for that producer, if any."""
        if partition not in self._partitions:
            return None
        header = _idempotent_header(records)
        if header is None:
            return None
        key = (partition, header.producer_id)
        found = self._entries.get(key)
        if found is None:
            return None
        if (header.producer_epoch, header.base_sequence) < (found.epoch, found.sequence):
            return None  # a batch before the refused one (or a stale epoch's: Kafka's check)
        state = producer_at(header.producer_id)
        owed = (
            self._clock() - found.at < self._memory_s
            and header.producer_epoch == found.epoch
            and header.base_sequence > found.sequence
            and (
                state is None
                or state.producer_epoch < found.epoch  # its new epoch has nothing here yet
                or (state.producer_epoch == found.epoch and state.last_seq < found.sequence)
            )
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
