"""The write-ahead log: records are durable here before they reach the LogCache and S3.

``record`` and ``header`` define the on-disk formats; ``file_wal`` is the file-backed ring with
group commit, over ``ring_file`` (the file itself: created, opened, locked, written, scanned
back), ``batch`` (a commit's appends and bytes) and ``async_commits`` (the event loop's commits
through an io_uring, ``uring``). ``object_wal`` is the WAL in object storage
(``s3.wal.path=0@s3://...``): its objects' format in ``wal_object``, which objects make a
node's log in ``object_chain``.
``interface.WriteAheadLog`` is what S3Storage uses of either.
"""

from storage.wal.errors import CorruptWALError, WALError
from storage.wal.file_wal import FileWAL
from storage.wal.interface import WALAppendResult, WALRecord, WALStats

__all__ = ["CorruptWALError", "FileWAL", "WALAppendResult", "WALError", "WALRecord", "WALStats"]
