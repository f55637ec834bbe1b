"""The write-ahead log: records are durable here before they reach the LogCache and S3.

``record`` and ``header`` define the on-disk formats; ``file_wal`` is the file-backed ring with
group commit.
"""

from storage.wal.errors import CorruptWALError, WALError
from storage.wal.file_wal import FileWAL, WALAppendResult, WALRecord, WALStats

__all__ = ["CorruptWALError", "FileWAL", "WALAppendResult", "WALError", "WALRecord", "WALStats"]
