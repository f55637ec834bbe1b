"""BlockCache: data blocks read from object storage, as the bytes of the object, bounded by
``s3.block.cache.size``. Keyed by (objectId, blockStartPosition).

Blocks are kept raw and parsed when read (``object_format.block_batches``), so filling the
cache never parses a whole object on the event loop. The blocks of one merged ranged GET are
views of its buffer (no copy): the buffer is counted once, from its first block's arrival until
its last block leaves, so the bytes counted are the bytes held.

Two least-recently-used lists, as AutoMQ's DataBlockCache tells read blocks from unread ones:
a block read ahead for a sequential reader is *unread* until that reader has passed it; blocks
already read are evicted first, so catch-up readers sharing the cache evict what they have
consumed before they evict each other's read-ahead.
"""

from __future__ import annotations

from collections import OrderedDict

Block = bytes | memoryview
_Key = tuple[int, int]


class SharedBuffer:
    """The buffer of one GET that several cached blocks are views of."""

    __slots__ = ("cached", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.cached = 0  # blocks of it in the cache


class BlockCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0  # bytes of the buffers held
        self.unread_size = 0  # bytes of the unread blocks
        self.hits = 0
        self.misses = 0
        self.evicted_unread = 0  # read-ahead dropped before it was read: the cache is too small
        self._read: OrderedDict[_Key, tuple[Block, SharedBuffer]] = OrderedDict()
        self._unread: OrderedDict[_Key, tuple[Block, SharedBuffer]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._read) + len(self._unread)

    def __contains__(self, key: _Key) -> bool:
        return key in self._read or key in self._unread

    def get(self, object_id: int, position: int) -> Block | None:
        """The block's bytes, or None; a hit counts as recently used (it keeps its list)."""
        key = (object_id, position)
        for blocks in (self._unread, self._read):
            entry = blocks.get(key)
            if entry is not None:
                blocks.move_to_end(key)
                self.hits += 1
                return entry[0]
        self.misses += 1
        return None

    def put(
        self,
        object_id: int,
        position: int,
        data: Block,
        *,
        unread: bool = False,
        buffer: SharedBuffer | None = None,
    ) -> None:
        """Keep a block (``unread``: read ahead, to be evicted after blocks already read);
        ``buffer`` is the GET's buffer when ``data`` is a view of it."""
        key = (object_id, position)
        self._remove(key)
        if buffer is None:
            buffer = SharedBuffer(len(data))
        if buffer.size > self.max_bytes:
            return
        if unread:
            self._unread[key] = (data, buffer)
            self.unread_size += len(data)
        else:
            self._read[key] = (data, buffer)
        if buffer.cached == 0:
            self.size += buffer.size
        buffer.cached += 1
        while self.size > self.max_bytes:
            if self._read:
                _, (evicted, owner) = self._read.popitem(last=False)
            else:
                _, (evicted, owner) = self._unread.popitem(last=False)
                self.evicted_unread += 1
                self.unread_size -= len(evicted)
            self._release(owner)

    def mark_read(self, object_id: int, position: int) -> None:
        """The reader that read this block ahead has passed it: evict it before unread ones."""
        key = (object_id, position)
        entry = self._unread.pop(key, None)
        if entry is not None:
            self.unread_size -= len(entry[0])
            self._read[key] = entry

    def _remove(self, key: _Key) -> None:
        entry = self._read.pop(key, None)
        if entry is None:
            entry = self._unread.pop(key, None)
            if entry is not None:
                self.unread_size -= len(entry[0])
        if entry is not None:
            self._release(entry[1])

    def _release(self, buffer: SharedBuffer) -> None:
        buffer.cached -= 1
        if buffer.cached == 0:
            self.size -= buffer.size

    def clear(self) -> None:
        for blocks in (self._read, self._unread):
            for _, buffer in blocks.values():
                buffer.cached = 0
            blocks.clear()
        self.size = 0
        self.unread_size = 0
