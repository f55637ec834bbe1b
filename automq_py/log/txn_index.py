"""The aborted-transaction index of a partition (Kafka's ``TransactionIndex``), kept in its Txn
stream.

Each aborted transaction is one 34-byte entry, Kafka's ``AbortedTxn`` layout (big-endian):

==================  ======  ====================================================
field               bytes   meaning
==================  ======  ====================================================
version             2       int16, ``0``
producer id         8       int64
first offset        8       int64: the transaction's first data offset here
last offset         8       int64: the offset of its ABORT marker
last stable offset  8       int64: the partition's LSO once the marker was written
==================  ======  ====================================================

In the Txn stream each entry takes as many offsets as it has bytes (as the time index does in
its stream), so an entry's position is its stream offset. A read_committed Fetch returns the
aborted transactions overlapping the range it returns (:func:`aborted_in_range`); the consumer
drops their records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

ENTRY_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34


class TxnIndexError(ValueError):
    """Bytes that are not aborted-transaction entries."""


@dataclass(slots=True, frozen=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(txn: AbortedTxn) -> bytes:
    return _ENTRY.pack(
        ENTRY_VERSION, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset
    )


def decode_entries(buf: bytes | memoryview) -> list[AbortedTxn]:
    """Every entry in ``buf`` (a whole number of entries)."""
    if len(buf) % ENTRY_SIZE:
        raise TxnIndexError(f"{len(buf)} bytes are not a whole number of {ENTRY_SIZE}-byte entries")
    out = []
    for version, pid, first, last, lso in _ENTRY.iter_unpack(buf):
        if version != ENTRY_VERSION:
            raise TxnIndexError(f"unknown aborted transaction entry version {version}")
        if not 0 <= first <= last:
            raise TxnIndexError(f"aborted transaction of producer {pid} spans [{first}, {last}]")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def aborted_in_range(
    entries: Iterable[AbortedTxn], fetch_offset: int, upper_bound: int
) -> list[AbortedTxn]:
    """The aborted transactions with data in ``[fetch_offset, upper_bound)`` (Kafka's
    ``collectAbortedTxns``: the marker at or after the fetch offset, the first offset before
    the bound), by first offset."""
    found = [t for t in entries if t.last_offset >= fetch_offset and t.first_offset < upper_bound]
    found.sort(key=lambda t: t.first_offset)
    return found
