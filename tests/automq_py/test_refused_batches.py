"""The memory of idempotent batches refused before they were appended: a later batch of the same
producer is held back until the refused one comes again (pure logic)."""

from __future__ import annotations

from collections.abc import Callable

from automq_py.producer_state import BatchMetadata, ProducerStateEntry
from automq_py.refused_batches import MEMORY_S, RefusedBatches
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch

PID = 7
TP = ("t", 0)
NOT_LEADER = ErrorCode.NOT_LEADER_OR_FOLLOWER


def batch(seq: int, *, pid: int = PID, epoch: int = 0, count: int = 3) -> bytes:
    records = [RecordInput(b"v", None, [], 1_700_000_000_000) for _ in range(count)]
    return bytes(build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq))


def unknown(_pid: int) -> ProducerStateEntry | None:
    return None


def known(epoch: int, last_seq: int) -> Callable[[int], ProducerStateEntry | None]:
    """A partition whose state has PID at ``epoch``, its last batch ending at ``last_seq``."""
    entry = ProducerStateEntry(PID)
    entry.add_batch(epoch, BatchMetadata(last_seq - 2, last_seq, 10, 12, 0), 0)
    return lambda pid: entry if pid == PID else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_later_batch_gets_the_refusal_until_the_refused_one_comes_again() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(0), NOT_LEADER)
    assert refused.held_back(TP, batch(3), unknown) == NOT_LEADER
    assert refused.held_back(TP, batch(6), unknown) == NOT_LEADER  # still owed
    assert refused.held_back(TP, batch(0), unknown) is None  # the retry goes ahead ...
    assert refused.held_back(TP, batch(3), unknown) is None  # ... and what followed it
    assert len(refused) == 0


def test_the_earliest_refused_sequence_is_owed() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(3), ErrorCode.REQUEST_TIMED_OUT)
    refused.refused(TP, batch(6), NOT_LEADER)  # later: the earlier one is still owed
    assert refused.held_back(TP, batch(6), unknown) == ErrorCode.REQUEST_TIMED_OUT
    refused.refused(TP, batch(0), NOT_LEADER)  # earlier still
    assert refused.held_back(TP, batch(3), unknown) == NOT_LEADER
    assert refused.held_back(TP, batch(0), unknown) is None


def test_a_refused_retry_is_owed_again() -> None:
    clock = Clock()
    refused = RefusedBatches(clock=clock)
    refused.refused(TP, batch(0), NOT_LEADER)
    clock.now += MEMORY_S - 1
    refused.refused(TP, batch(0), NOT_LEADER)  # the retry, refused too: remembered afresh
    clock.now += 2
    assert refused.held_back(TP, batch(3), unknown) == NOT_LEADER


def test_nothing_is_held_back_once_the_refused_batch_landed() -> None:
    """It was written through the broker that led the partition then."""
    refused = RefusedBatches()
    refused.refused(TP, batch(3), NOT_LEADER)
    assert refused.held_back(TP, batch(90), known(0, 5)) is None
    assert len(refused) == 0
    refused.refused(TP, batch(3), NOT_LEADER)
    assert refused.held_back(TP, batch(90), known(0, 3)) is None  # its first record landed


def test_a_known_producer_s_later_batch_is_held_back_while_the_refused_one_is_owed() -> None:
    """Not answered OUT_OF_ORDER_SEQUENCE_NUMBER, which makes librdkafka bump the producer's
    epoch and send every partition's unacknowledged batches again."""
    refused = RefusedBatches()
    refused.refused(TP, batch(75), NOT_LEADER)
    assert refused.held_back(TP, batch(78), known(0, 74)) == NOT_LEADER
    assert refused.held_back(TP, batch(75), known(0, 74)) is None  # the retry goes ahead
    assert refused.held_back(TP, batch(78), known(0, 77)) is None
    assert len(refused) == 0


def test_a_batch_before_the_refused_one_goes_ahead_and_the_refused_one_is_still_owed() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(6), NOT_LEADER)
    assert refused.held_back(TP, batch(3), known(0, 2)) is None
    assert refused.held_back(TP, batch(9), known(0, 5)) == NOT_LEADER


def test_a_producer_the_partition_knows_at_a_newer_epoch_is_not_held_back() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(6), NOT_LEADER)
    assert refused.held_back(TP, batch(9), known(1, 0)) is None
    assert len(refused) == 0


def test_a_refused_first_batch_of_a_new_epoch_is_owed_where_the_old_epoch_is_known() -> None:
    """The partition's state still has the epoch before: it would answer the new epoch's
    second batch OUT_OF_ORDER_SEQUENCE_NUMBER (a new epoch starts at sequence 0)."""
    refused = RefusedBatches()
    refused.refused(TP, batch(0, epoch=1), NOT_LEADER)
    assert refused.held_back(TP, batch(3, epoch=1), known(0, 40)) == NOT_LEADER
    assert refused.held_back(TP, batch(0, epoch=1), known(0, 40)) is None


def test_a_stale_epoch_neither_replaces_nor_clears_a_newer_refusal() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(6, epoch=2), NOT_LEADER)
    refused.refused(TP, batch(30, epoch=1), ErrorCode.REQUEST_TIMED_OUT)  # a zombie's retry
    assert refused.held_back(TP, batch(33, epoch=1), unknown) is None  # Kafka's check answers
    assert refused.held_back(TP, batch(9, epoch=2), unknown) == NOT_LEADER


def test_a_newer_epoch_starts_afresh() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(5, epoch=1), NOT_LEADER)
    assert refused.held_back(TP, batch(0, epoch=2), unknown) is None
    assert refused.held_back(TP, batch(8, epoch=1), unknown) is None  # forgotten


def test_other_producers_and_partitions_are_not_held_back() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(0), NOT_LEADER)
    assert refused.held_back(TP, batch(3, pid=PID + 1), unknown) is None
    assert refused.held_back(("t", 1), batch(3), unknown) is None
    assert refused.held_back(("u", 0), batch(3), unknown) is None
    assert refused.held_back(TP, batch(3), unknown) == NOT_LEADER


def test_only_retried_refusals_of_idempotent_batches_are_remembered() -> None:
    refused = RefusedBatches()
    refused.refused(TP, batch(0), ErrorCode.MESSAGE_TOO_LARGE)  # given up by the client
    refused.refused(TP, batch(0, pid=-1), NOT_LEADER)  # no producer id
    refused.refused(TP, b"\x00" * 10, NOT_LEADER)  # not a batch
    assert len(refused) == 0
    assert refused.held_back(TP, batch(3), unknown) is None
    assert refused.held_back(TP, b"\x00" * 10, unknown) is None


def test_refusals_are_forgotten_after_a_while_and_beyond_the_cap() -> None:
    clock = Clock()
    refused = RefusedBatches(clock=clock, max_entries=2)
    refused.refused(TP, batch(0), NOT_LEADER)
    clock.now += MEMORY_S
    assert refused.held_back(TP, batch(3), unknown) is None  # expired
    for pid in (1, 2, 3):
        refused.refused(TP, batch(0, pid=pid), NOT_LEADER)
        clock.now += 1
    assert len(refused) == 2
    assert refused.held_back(TP, batch(3, pid=1), unknown) is None  # the oldest went
    assert refused.held_back(TP, batch(3, pid=3), unknown) == NOT_LEADER
