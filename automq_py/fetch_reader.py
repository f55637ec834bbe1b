"""A fetch's read: Kafka's ``ReplicaManager.readFromLog`` and its delayed fetch.

:class:`FetchReader` reads the partitions a Fetch asks for, whole batches within each
partition's and the request's byte limits, and while fewer than ``min_bytes`` came back waits on
those partitions alone for their high watermark to move, up to ``max_wait`` (Kafka's
``DelayedFetch``). A partition that fails to open or read is its own error code; the others
carry on. The replica manager owns the partitions and hands the reader its way of opening one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from automq_py.log.txn_index import AbortedTxn
from automq_py.metrics.topic_stats import BrokerTopicStats
from automq_py.partition import Partition
from automq_py.topics import TopicInfo
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.fetch import FetchPartitionResult
from storage.eager import gather_eagerly


@dataclass(slots=True)
class FetchEntry:
    """One partition to read: from ``offset``, at most ``max_bytes`` of it; the leader epoch
    the client knows (-1: none given, Fetch v8 and older)."""

    topic: TopicInfo | None
    index: int
    offset: int
    max_bytes: int
    error: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    current_leader_epoch: int = -1

    @property
    def known(self) -> bool:
        """Whether the entry names a partition of a topic (else it answers ``error``)."""
        return self.topic is not None and 0 <= self.index < self.topic.partitions


# What a fetch read from one partition (Kafka's ``FetchPartitionData``): the response's
# partition itself, which the handler encodes as the reader made it. ``records_size`` is the
# bytes of ``records``; ``aborted_transactions`` (read_committed, else None) the aborted
# transactions with data among them, the index's entries as they are.
FetchData = FetchPartitionResult


def leader_epoch_error(current: int, leader_epoch: int) -> ErrorCode | None:
    """What a request naming ``current`` as the partition's leader epoch (-1: none) gets from
    a partition led at ``leader_epoch`` (Kafka's checkCurrentLeaderEpoch): an older one is
    FENCED_LEADER_EPOCH (the client's metadata is stale), a newer one UNKNOWN_LEADER_EPOCH
    (this broker's is); None when they agree."""
    if current < 0 or current == leader_epoch:
        return None
    if current < leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    return ErrorCode.UNKNOWN_LEADER_EPOCH


def fetch_data(entry: FetchEntry, error: ErrorCode) -> FetchData:
    """An entry's partition that read nothing: ``error`` and no offsets (-1), or no error
    before a read."""
    return FetchPartitionResult(entry.index, error, records_size=0)


class FetchReader:
    """Reads fetches through ``partition`` (the replica manager's: opens a partition this
    broker leads, or raises); ``failed`` maps a partition's open or read failure to its code;
    ``stats`` counts what each topic's fetches returned."""

    def __init__(
        self,
        partition: Callable[[TopicInfo, int], Awaitable[Partition]],
        failed: Callable[[FetchEntry, BaseException], ErrorCode],
        stats: BrokerTopicStats,
        opened: Callable[[TopicInfo, int], Partition | None] = lambda topic, index: None,
    ) -> None:
        """``opened``: the partition if it is open, at once (None: :meth:`fetch` opens it)."""
        self._partition = partition
        self._failed = failed
        self._stats = stats
        self._opened = opened

    async def fetch(
        self,
        entries: Sequence[FetchEntry],
        *,
        max_bytes: int,
        min_bytes: int,
        max_wait_s: float,
        read_committed: bool = False,
    ) -> list[FetchData]:
        """Read every entry (the first partition with data returns at least one batch, even
        past ``max_bytes``); while fewer than ``min_bytes`` came back and no partition failed,
        wait up to ``max_wait_s`` from the first read (Kafka's DelayedFetch) for one of them to
        get new data, and read again.
        ``read_committed`` (isolation level 1) reads up to each partition's last stable offset
        and lists the aborted transactions among what it returns."""
        deadline = None
        while True:
            partitions: list[Partition | None] = []
            read = self._read_all_cached(entries, max_bytes, partitions, read_committed)
            if read is None:
                results = await self._read_all(entries, max_bytes, partitions, read_committed)
                total = sum(r.records_size for r in results)
                failed = any(r.error_code != ErrorCode.NONE for r in results)
            else:
                results, total, failed = read
            if total >= min_bytes or failed:
                break
            if deadline is None:
                deadline = time.monotonic() + max(0.0, max_wait_s)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waiting = [
                (p, r.high_watermark)
                for p, r in zip(partitions, results, strict=True)
                if p is not None
            ]
            if not waiting:
                break
            await _wait_for_data(waiting, remaining)
        fetched = self._stats.fetched
        for entry, r in zip(entries, results, strict=True):
            if entry.topic is not None:
                fetched(entry.topic.name, r.records_size, r.error_code != ErrorCode.NONE)
        return results

    async def _read_all(
        self,
        entries: Sequence[FetchEntry],
        max_bytes: int,
        partitions: list[Partition | None],
        read_committed: bool,
    ) -> list[FetchData]:
        """Kafka's readFromLog: each partition reads at most its own max_bytes and what is
        left of the request's ``max_bytes``, whole batches only, except that until one
        partition has returned data a read returns at least one batch, however large. So
        only the first batch of the first partition with data may go past either limit. (A
        fetch tries :meth:`_read_all_cached` first.)"""
        # open the partitions concurrently: a first open after a start reads from object storage
        # (eagerly: an open partition, or a read from the LogCache, costs no task)
        opened = await gather_eagerly(*(self._open_for_read(entry) for entry in entries))
        partitions.extend(p if isinstance(p, Partition) else None for p in opened)
        early: list[FetchData] | None = None
        if all(e.max_bytes > 0 for e in entries) and sum(e.max_bytes for e in entries) <= max_bytes:
            # every partition's limit fits in max_bytes: each read's limit is its own, so
            # they run concurrently (a cold read waits for object storage), strictly within
            # it; the walk below redoes the few that the at-least-one-batch rule changes
            early = list(
                await gather_eagerly(
                    *(
                        self._read_partition(entry, p, entry.max_bytes, read_committed, False)
                        if isinstance(p, Partition)
                        else _done(p)
                        for entry, p in zip(entries, opened, strict=True)
                    )
                )
            )
        total = 0
        results: list[FetchData] = []
        for i, (entry, p) in enumerate(zip(entries, opened, strict=True)):
            if not isinstance(p, Partition):
                results.append(p)
                continue
            min_one = total == 0  # no partition has returned data yet
            limit = min(entry.max_bytes, max(max_bytes - total, 0))
            data = early[i] if early is not None else None
            if (
                data is None
                or limit != entry.max_bytes
                # the strict read found nothing: its first batch may be past the limit
                or (min_one and data.records_size == 0 and data.error_code == ErrorCode.NONE)
            ):
                data = await self._read_partition(entry, p, limit, read_committed, min_one)
            total += data.records_size
            results.append(data)
        return results

    def _read_all_cached(
        self,
        entries: Sequence[FetchEntry],
        max_bytes: int,
        partitions: list[Partition | None],
        read_committed: bool,
    ) -> tuple[list[FetchData], int, bool] | None:
        """:meth:`_read_all` at once, without a coroutine per partition, when every partition
        is open and the LogCache holds what each read returns (a consumer keeping up), and,
        ``read_committed`` (librdkafka's default), each one's aborted-transaction index is
        loaded: the reads, their bytes, and whether one failed; None otherwise."""
        opened: list[Partition] = []
        for entry in entries:
            topic = entry.topic
            if topic is None or not entry.known:
                return None  # the error's answer is the coroutines' (_open_for_read)
            p = self._opened(topic, entry.index)
            if p is None or (
                entry.current_leader_epoch >= 0 and entry.current_leader_epoch != p.leader_epoch
            ):
                return None
            opened.append(p)
        total = 0
        failed = False
        results: list[FetchData] = []
        for entry, p in zip(entries, opened, strict=True):
            limit = min(entry.max_bytes, max(max_bytes - total, 0))
            data = self._read_partition_cached(entry, p, limit, total == 0, read_committed)
            if data is None:
                return None
            total += data.records_size
            failed = failed or data.error_code != ErrorCode.NONE
            results.append(data)
        partitions.extend(opened)
        return results, total, failed

    async def _open_for_read(self, entry: FetchEntry) -> Partition | FetchData:
        """The entry's partition, or the FetchData of its error."""
        topic = entry.topic
        if topic is None or not entry.known:
            return fetch_data(entry, entry.error)
        try:
            partition = await self._partition(topic, entry.index)
        except Exception as e:
            return fetch_data(entry, self._failed(entry, e))
        error = leader_epoch_error(entry.current_leader_epoch, partition.leader_epoch)
        return partition if error is None else fetch_data(entry, error)

    async def _read_partition(
        self,
        entry: FetchEntry,
        partition: Partition,
        limit: int,
        read_committed: bool,
        min_one: bool,
    ) -> FetchData:
        """Read ``entry``'s partition: whole batches up to ``limit`` bytes, at least one
        (however large) when ``min_one``."""
        data, end = _partition_data(entry, partition, read_committed)
        if data.error_code == ErrorCode.NONE and entry.offset < end and (limit > 0 or min_one):
            try:
                records = await partition.read(entry.offset, limit, end, min_one=min_one)
                if read_committed and records:
                    aborted = _aborted_at_once(entry, partition, records)
                    if aborted is None:  # the index's first read since the partition opened
                        aborted = await partition.log.aborted_transactions(
                            entry.offset, _records_end(records[-1], entry.offset)
                        )
                    data.aborted_transactions = aborted
            except Exception as e:  # out of range (a trim raced), or storage failing
                return fetch_data(entry, self._failed(entry, e))
            data.records = records
            data.records_size = sum(len(r) for r in records)
        return data

    def _read_partition_cached(
        self,
        entry: FetchEntry,
        partition: Partition,
        limit: int,
        min_one: bool,
        read_committed: bool,
    ) -> FetchData | None:
        """:meth:`_read_partition` at once, when the LogCache holds what it returns (and the
        aborted-transaction index is loaded); None when the read would wait."""
        data, end = _partition_data(entry, partition, read_committed)
        if data.error_code == ErrorCode.NONE and entry.offset < end and (limit > 0 or min_one):
            try:
                read = partition.log.read_cached(
                    entry.offset,
                    limit,
                    max_offset=end,
                    min_one=min_one,
                    high_watermark=data.high_watermark,
                )
                if read is None:
                    return None
                records, size = read
                if read_committed and records:
                    aborted = _aborted_at_once(entry, partition, records)
                    if aborted is None:
                        return None
                    data.aborted_transactions = aborted
            except Exception as e:
                return fetch_data(entry, self._failed(entry, e))
            data.records = records
            data.records_size = size
        return data


def _aborted_at_once(
    entry: FetchEntry, partition: Partition, records: list[memoryview]
) -> list[AbortedTxn] | None:
    """The aborted transactions with data among ``records`` (read from ``entry``'s offset),
    once the partition's index is loaded; None before (the caller loads it, waiting)."""
    return partition.log.aborted_transactions_cached(
        entry.offset, lambda: _records_end(records[-1], entry.offset)
    )


def _partition_data(
    entry: FetchEntry, partition: Partition, read_committed: bool
) -> tuple[FetchData, int]:
    """A read of ``entry``'s partition before it reads: its offsets, and where the read ends,
    the high watermark or (``read_committed``) the last stable offset. An offset outside the
    log is OFFSET_OUT_OF_RANGE with no offsets (-1), as Kafka answers any partition whose
    read failed."""
    log = partition.log
    hw = log.high_watermark
    if log.out_of_range(entry.offset, hw):
        return fetch_data(entry, ErrorCode.OFFSET_OUT_OF_RANGE), hw
    lso = log.stable_offset(hw)
    data = FetchPartitionResult(
        entry.index,
        ErrorCode.NONE,
        hw,
        lso,
        log.log_start_offset,
        [] if read_committed else None,
        records_size=0,
    )
    return data, (lso if read_committed else hw)


async def _wait_for_data(partitions: list[tuple[Partition, int]], timeout: float) -> None:
    """Wait until one of ``partitions`` has new data (its high watermark moves from the one
    read), or ``timeout``."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for p, _ in partitions:
        p.add_data_waiter(waiter)
    try:
        # data may have arrived between the read and now
        if any(p.high_watermark != hw for p, hw in partitions):
            return
        await asyncio.wait_for(asyncio.shield(waiter), timeout)
    except TimeoutError:
        pass
    finally:
        for p, _ in partitions:
            p.remove_data_waiter(waiter)
        if not waiter.done():
            waiter.cancel()


async def _done(data: FetchData) -> FetchData:
    return data


def _records_end(view: memoryview, end: int) -> int:
    """The offset after the last batch in ``view`` (a read returns whole batches, several
    per buffer): where a read_committed fetch's aborted-transaction lookup ends."""
    for header, _ in record_batch.iter_batches(view):
        end = header.last_offset + 1
    return end
