"""Which WAL objects make a node's log: trim point, fencing, chain, cuts (pure, no I/O)."""

from __future__ import annotations

from storage.wal import wal_object
from storage.wal.object_chain import ChainWalk, ListedObject, plan_recovery
from storage.wal.record import HEADER_SIZE
from storage.wal.wal_object import OBJECT_HEADER_SIZE, EpochRecord

NODE = 1


class Bucket:
    """WAL objects built in memory, listed as a store would list them."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def write(self, start: int, epoch: int, bodies: list[bytes]) -> int:
        """Write an object of ``bodies`` at ``start``; its end offset."""
        key = wal_object.object_key("ns", NODE, start, epoch)
        parts = wal_object.encode_object(NODE, epoch, start, [[b] for b in bodies])
        self.data[key] = b"".join(bytes(p) for p in parts)
        return start + len(self.data[key]) - OBJECT_HEADER_SIZE

    def listed(self) -> list[ListedObject]:
        prefix = wal_object.node_prefix("ns", NODE)
        out = []
        for key, data in sorted(self.data.items()):
            name = wal_object.parse_object_key(prefix, key)
            assert name is not None
            out.append(ListedObject(key, name.start_offset, name.epoch, len(data)))
        return out

    def walk(self, records: list[EpochRecord]) -> tuple[list[bytes], ChainWalk]:
        walk = ChainWalk(plan_recovery(self.listed(), records), NODE, self.data)
        return [bytes(r.body) for r in walk.records()], walk


def size(body: bytes) -> int:
    return HEADER_SIZE + len(body)


def test_chain_follows_end_offsets_in_order() -> None:
    bucket = Bucket()
    end = bucket.write(0, 1, [b"a", b"b"])
    end = bucket.write(end, 1, [b"c"])
    end = bucket.write(end, 1, [b"d", b"e"])
    bodies, walk = bucket.walk([EpochRecord(NODE, 1, 0, 0)])
    assert bodies == [b"a", b"b", b"c", b"d", b"e"]
    assert walk.end_offset == end and not walk.problems
    assert [o.start_offset for o in walk.chain] == [0, 2 * size(b"a"), 3 * size(b"a")]


def test_recovery_starts_at_the_trim_point_inside_an_object() -> None:
    bucket = Bucket()
    first = bucket.write(0, 1, [b"a", b"b"])
    bucket.write(first, 1, [b"c"])
    plan = plan_recovery(bucket.listed(), [EpochRecord(NODE, 1, 0, size(b"a"))])
    assert plan.trim_offset == size(b"a") and not plan.stale
    bodies, _ = bucket.walk([EpochRecord(NODE, 1, 0, size(b"a"))])
    assert bodies == [b"b", b"c"]
    # trimmed past the first object: it is stale
    plan = plan_recovery(bucket.listed(), [EpochRecord(NODE, 1, 0, first)])
    assert [o.start_offset for o in plan.stale] == [0]
    assert bucket.walk([EpochRecord(NODE, 1, 0, first)])[0] == [b"c"]


def test_the_newest_epoch_record_gives_the_trim_point() -> None:
    bucket = Bucket()
    end = bucket.write(0, 1, [b"a"])
    bucket.write(end, 2, [b"b"])
    records = [EpochRecord(NODE, 1, 0, 999), EpochRecord(NODE, 2, end, end)]
    assert plan_recovery(bucket.listed(), records).trim_offset == end
    assert bucket.walk(records)[0] == [b"b"]


def test_an_older_incarnation_writing_after_a_takeover_is_fenced() -> None:
    bucket = Bucket()
    end1 = bucket.write(0, 1, [b"a"])
    # epoch 2 recovered [0, end1) and took over there; epoch 1, resumed, wrote on at end1
    # (the same start offset as epoch 2's object) and after it
    zombie_end = bucket.write(end1, 1, [b"zombie-1", b"zombie-2"])
    bucket.write(zombie_end, 1, [b"zombie-3"])
    end2 = bucket.write(end1, 2, [b"b"])
    records = [EpochRecord(NODE, 1, 0, 0), EpochRecord(NODE, 2, end1, 0)]
    plan = plan_recovery(bucket.listed(), records)
    assert sorted((o.start_offset, o.epoch) for o in plan.fenced) == [(end1, 1), (zombie_end, 1)]
    bodies, walk = bucket.walk(records)
    assert bodies == [b"a", b"b"] and walk.end_offset == end2


def test_without_the_newer_incarnations_record_a_zombies_objects_are_the_log() -> None:
    # (why every incarnation writes its epoch record before its first append)
    bucket = Bucket()
    end1 = bucket.write(0, 1, [b"a"])
    bucket.write(end1, 1, [b"late"])
    assert bucket.walk([EpochRecord(NODE, 1, 0, 0)])[0] == [b"a", b"late"]


def test_the_highest_epoch_wins_where_two_objects_start_at_the_same_offset() -> None:
    bucket = Bucket()
    bucket.write(0, 3, [b"old"])
    bucket.write(0, 4, [b"new"])
    assert bucket.walk([])[0] == [b"new"]


def test_a_gap_ends_the_log_and_what_lies_past_it_was_never_acknowledged() -> None:
    bucket = Bucket()
    end = bucket.write(0, 1, [b"a"])
    bucket.write(end + size(b"lost"), 1, [b"after-gap"])  # the object at `end` never landed
    records = [EpochRecord(NODE, 1, 0, 0)]
    bodies, walk = bucket.walk(records)
    assert bodies == [b"a"] and walk.end_offset == end and not walk.problems
    plan = plan_recovery(bucket.listed(), records)
    assert [o.start_offset for o in plan.past(walk.end_offset, walk.chain)] == [end + size(b"lost")]


def test_a_corrupt_object_keeps_the_records_before_the_damage() -> None:
    bucket = Bucket()
    end = bucket.write(0, 1, [b"a", b"b", b"c"])
    bucket.write(end, 1, [b"d"])
    key = wal_object.object_key("ns", NODE, 0, 1)
    damaged = bytearray(bucket.data[key])
    damaged[OBJECT_HEADER_SIZE + size(b"a") + HEADER_SIZE] ^= 0xFF  # b's body
    bucket.data[key] = bytes(damaged)
    bodies, walk = bucket.walk([EpochRecord(NODE, 1, 0, 0)])
    assert bodies == [b"a"]
    assert walk.end_offset == size(b"a")
    assert "body CRC mismatch" in walk.problems[0]


def test_a_later_incarnation_continues_at_the_cut() -> None:
    bucket = Bucket()
    bucket.write(0, 1, [b"a", b"b"])
    key = wal_object.object_key("ns", NODE, 0, 1)
    bucket.data[key] = bucket.data[key][:-1]  # truncated: b is torn
    cut = size(b"a")
    end = bucket.write(cut, 2, [b"c"])
    records = [EpochRecord(NODE, 1, 0, 0), EpochRecord(NODE, 2, cut, 0)]
    bodies, walk = bucket.walk(records)
    assert bodies == [b"a", b"c"] and walk.end_offset == end
    # and once trimmed into epoch 2's object, the torn one is not read again
    bodies, _ = bucket.walk([EpochRecord(NODE, 1, 0, 0), EpochRecord(NODE, 2, cut, cut)])
    assert bodies == [b"c"]


def test_an_object_that_vanished_ends_the_log() -> None:
    bucket = Bucket()
    end = bucket.write(0, 1, [b"a"])
    bucket.write(end, 1, [b"b"])
    walk = ChainWalk(
        plan_recovery(bucket.listed(), []),
        NODE,
        {k: v for k, v in bucket.data.items() if not k.endswith(f"{end:020d}-{1:020d}")},
    )
    assert [bytes(r.body) for r in walk.records()] == [b"a"]
    assert walk.end_offset == end and "vanished" in walk.problems[0]


def test_nothing_listed_is_an_empty_log_at_the_trim_point() -> None:
    walk = ChainWalk(plan_recovery([], [EpochRecord(NODE, 5, 700, 700)]), NODE, {})
    assert list(walk.records()) == [] and walk.end_offset == 700
    assert plan_recovery([], []).newest_epoch == -1
