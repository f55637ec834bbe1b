"""Errors raised by the write-ahead log, shared by the format modules and ``FileWAL``."""

from __future__ import annotations


class WALError(Exception):
    """The WAL cannot do what was asked: misconfiguration, closed, failed or invalid use."""


class CorruptWALError(WALError):
    """Bytes read from the WAL file do not follow the WAL format (torn write, bit rot, garbage)."""


class CorruptRecordError(CorruptWALError):
    """A record header or body failed validation; ``reason`` says which check failed."""

    def __init__(self, reason: str, detail: str, *, found_offset: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        # Set on an offset mismatch, so recovery can tell a record from an older lap (the normal
        # end of the log) from a torn one.
        self.found_offset = found_offset
