"""What the coordinator reads of the classic consumer protocol's opaque member metadata.

A consumer's JoinGroup protocol metadata is a ``ConsumerProtocolSubscription`` (int16 version,
then an int32 count of int16-length topic names, then user data and, in later versions, owned
partitions). The coordinator only needs the topic names: OffsetDelete refuses to delete offsets
of topics the group subscribes to, and offset retention keeps them.
"""

from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The topic names of a ``ConsumerProtocolSubscription``; None if it does not parse."""
    try:
        pos = 2  # version: every version starts with the topics
        (count,) = _I32.unpack_from(metadata, pos)
        pos += 4
        if count < 0 or count > len(metadata):
            return None
        topics = set()
        for _ in range(count):
            (n,) = _I16.unpack_from(metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
