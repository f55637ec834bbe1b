"""Which WAL objects make a node's log: pure planning over a listing, no I/O.

A node's log is a chain of WAL objects, each starting where the one before it ends. Objects are
written by incarnations of the node (its node epochs); each incarnation first writes an epoch
record saying where its log begins (the end of what it recovered) and, at each trim, below which
offset everything is in object storage (see ``storage.wal.wal_object``).

The rules recovery follows:

* **Trim point**: the trim offset of the epoch record with the highest epoch (0 without one).
  Objects ending at or before it are *stale*: replayed never, deleted at leisure.
* **Fencing**: an object written at epoch ``e`` starting at or after the start offset of an
  epoch record with a higher epoch is *fenced*: an older incarnation (frozen, then resumed)
  wrote it after a newer one had taken the log over from that offset, so it was never part of
  the log. It is never replayed, whenever it appeared.
* **Chain**: from the trim point, the live object holding it, then at each end offset the live
  object starting exactly there; where several qualify, the highest epoch wins. The chain ends
  at the first offset no live object starts at, or where an object is cut short (torn or
  damaged: its records before the damage are kept, as a file WAL keeps a corrupt tail's
  predecessors). Live objects past the end were never acknowledged (the writer acknowledges in
  offset order) and are fenced by the recovering incarnation's own epoch record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from storage.wal.errors import CorruptRecordError, CorruptWALError
from storage.wal.record import Buffer
from storage.wal.wal_object import (
    OBJECT_HEADER_SIZE,
    EpochRecord,
    ObjectName,
    ObjectRecord,
    check_object,
    decode_object_header,
    iter_records,
)


@dataclass(slots=True, frozen=True)
class ListedObject:
    """A WAL object as listed: its key, what the key says, and its size."""

    key: str
    start_offset: int
    epoch: int
    size: int

    @property
    def end_offset(self) -> int:
        """The end its size implies (its header must agree, else it is cut where it breaks)."""
        return self.start_offset + max(self.size - OBJECT_HEADER_SIZE, 0)


@dataclass(slots=True, frozen=True)
class RecoveryPlan:
    """What a listing says before any object is read."""

    trim_offset: int
    live: tuple[ListedObject, ...]  # not fenced and reaching past the trim point, by start
    stale: tuple[ListedObject, ...]  # wholly before the trim point
    fenced: tuple[ListedObject, ...]  # written by an incarnation after a newer one took over
    newest_epoch: int  # the highest epoch of any object or epoch record; -1 if none

    def past(self, end_offset: int, chain: Iterable[ListedObject]) -> list[ListedObject]:
        """Live objects off the chain starting at or after ``end_offset``: never acknowledged."""
        on_chain = {o.key for o in chain}
        return [o for o in self.live if o.start_offset >= end_offset and o.key not in on_chain]


def is_fenced(obj: ListedObject, records: Iterable[EpochRecord]) -> bool:
    """Whether a newer incarnation's log began at or before ``obj``'s start."""
    return any(r.epoch > obj.epoch and obj.start_offset >= r.start_offset for r in records)


def plan_recovery(objects: Iterable[ListedObject], records: Iterable[EpochRecord]) -> RecoveryPlan:
    """Sort a node's listed WAL objects by the rules in the module docstring."""
    records = list(records)
    objects = sorted(objects, key=lambda o: (o.start_offset, o.epoch))
    newest = max(records, key=lambda r: r.epoch, default=None)
    trim = newest.trim_offset if newest is not None else 0
    live: list[ListedObject] = []
    stale: list[ListedObject] = []
    fenced: list[ListedObject] = []
    for obj in objects:
        if obj.end_offset <= trim:
            stale.append(obj)
        elif is_fenced(obj, records):
            fenced.append(obj)
        else:
            live.append(obj)
    epochs = [o.epoch for o in objects] + [r.epoch for r in records]
    return RecoveryPlan(trim, tuple(live), tuple(stale), tuple(fenced), max(epochs, default=-1))


def first_object(plan: RecoveryPlan) -> ListedObject | None:
    """The live object holding the trim point (or starting at it), highest epoch first."""
    holding = [o for o in plan.live if o.start_offset <= plan.trim_offset < o.end_offset]
    return max(holding, key=lambda o: o.epoch, default=None)


def by_start_offset(plan: RecoveryPlan) -> dict[int, ListedObject]:
    """Start offset -> the live object starting there (the highest epoch where several do)."""
    found: dict[int, ListedObject] = {}
    for obj in plan.live:
        current = found.get(obj.start_offset)
        if current is None or obj.epoch > current.epoch:
            found[obj.start_offset] = obj
    return found


class ChainWalk:
    """Walk a node's chain over objects already read (``data``: key -> the object's bytes; a
    missing key is an object that vanished) and yield its records from the trim point on.

    After ``records()`` is exhausted, ``end_offset`` is where the log ends (appends continue
    there), ``chain`` lists the objects read and ``problems`` what cut an object short.
    """

    def __init__(self, plan: RecoveryPlan, node_id: int, data: Mapping[str, Buffer]) -> None:
        self._plan = plan
        self._node_id = node_id
        self._data = data
        self.end_offset = plan.trim_offset
        self.chain: list[ListedObject] = []
        self.problems: list[str] = []
        self.records_read = 0

    def records(self) -> Iterator[ObjectRecord]:
        starting_at = by_start_offset(self._plan)
        obj = first_object(self._plan)
        position = self._plan.trim_offset
        seen: set[str] = set()
        while obj is not None and obj.key not in seen:
            seen.add(obj.key)
            self.chain.append(obj)
            data = self._data.get(obj.key)
            if data is None:
                self.problems.append(f"WAL object {obj.key} vanished while recovering")
                return
            try:
                header = decode_object_header(data)
                check_object(header, self._node_id, ObjectName(obj.start_offset, obj.epoch))
                for rec in iter_records(header, data, from_offset=position):
                    self.records_read += 1
                    self.end_offset = rec.next_offset
                    yield rec
                # a header claiming more than the object holds ends in a short record above
                self.end_offset = max(self.end_offset, header.end_offset, position)
            except (CorruptRecordError, CorruptWALError) as exc:
                self.end_offset = max(self.end_offset, position)
                self.problems.append(f"WAL object {obj.key}: {exc}")
                # an object a later incarnation started at the cut continues the log
                position = self.end_offset
                obj = starting_at.get(position)
                continue
            position = self.end_offset
            obj = starting_at.get(position)
