"""Garbage collection planning (pure): which keys of the bucket may be deleted.

* Objects MARK_DESTROYED (compacted away, trimmed, expired while PREPARED) longer than
  ``s3.object.delete.retention.minutes``: readers that looked them up before have had time to
  finish.
* Orphans: keys of this cluster's namespace that name no object the metadata knows (an upload
  whose metadata never came, a delete that failed half-way), older than a safety age so that an
  object being uploaded right now is never taken for one.

Keys of other namespaces (other clusters sharing the bucket) and keys not in the object key
format are never touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from storage.metadata.image import MetadataImage
from storage.metadata.model import ObjectState, S3Object
from storage.operator.base import ObjectInfo

KEY_PREFIXES = tuple("0123456789abcdef")
"""The first character of every object key (the last hex digit of its id): one listing each."""


@dataclass(slots=True, frozen=True)
class Orphan:
    key: str
    object_id: int
    size: int
    age_ms: int


def parse_object_key(key: str, namespace: str) -> int | None:
    """The object id a key of ``namespace`` names, or None if it is not such a key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[1] != namespace or not parts[2].isdigit():
        return None
    object_id = int(parts[2])
    if parts[0] != f"{object_id:08x}"[::-1]:
        return None
    return object_id


def destroyable(image: MetadataImage, now_ms: int, retention_ms: int) -> list[S3Object]:
    """MARK_DESTROYED objects marked at least ``retention_ms`` ago, by id."""
    return image.objects_to_delete(now_ms - retention_ms)


def find_orphans(
    listing: Iterable[ObjectInfo],
    image: MetadataImage,
    namespace: str,
    now_ms: int,
    min_age_ms: int,
) -> list[Orphan]:
    """Keys of ``namespace`` that no live object of ``image`` names, older than ``min_age_ms``.

    List the bucket *before* reading ``image``: an object is named in the metadata (PREPARED)
    before it is written, so a key listed earlier is known to a later image unless it is
    really an orphan.
    """
    out: list[Orphan] = []
    for info in listing:
        object_id = parse_object_key(info.key, namespace)
        if object_id is None:
            continue
        known = image.objects.get(object_id)
        if known is not None and known.state is not ObjectState.DESTROYED:
            continue
        age = now_ms - info.last_modified_ms
        if info.last_modified_ms <= 0 or age < min_age_ms:
            continue
        out.append(Orphan(info.key, object_id, info.size, age))
    return out
