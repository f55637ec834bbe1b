"""Errors the Stream API raises to its callers."""

from __future__ import annotations


class StorageError(Exception):
    """Base of the stream store's errors."""


class StreamFencedError(StorageError):
    """A newer epoch owns the stream: this writer must stop."""


class StreamClosedError(StorageError):
    """The stream was closed (or failed) on this node."""


class StorageFailedError(StreamClosedError):
    """The stream store failed (a WAL write or fsync, or a metadata commit): it accepts no
    more appends until the node restarts and recovers."""


class OffsetOutOfRangeError(StorageError):
    """The requested offset lies outside ``[start_offset, confirmed end]``."""
