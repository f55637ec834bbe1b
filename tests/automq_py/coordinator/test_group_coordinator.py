"""The group coordinator in a real broker (in-process, embedded file store): what it writes to
``__consumer_offsets`` comes back after a restart, and offset retention expires what it should.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from automq_py.broker import Broker
from automq_py.config import BrokerConfig
from automq_py.coordinator.classic_group import ClassicGroup, ClassicState
from automq_py.coordinator.classic_protocol import JoinRequest
from automq_py.coordinator.consumer_group import ConsumerGroup, HeartbeatRequest
from automq_py.coordinator.consumer_protocol import parse_assignment, serialize_assignment
from automq_py.coordinator.group_coordinator import OFFSETS_TOPIC, GroupCoordinator
from automq_py.coordinator.offsets import OffsetCommit, OffsetManager, validate_commit
from automq_py.coordinator.runtime import CoordinatorRuntime, partition_for
from automq_py.partition import AppendResult
from automq_py.topics import TopicInfo
from protocol.errors import ErrorCode
from tests.support.broker import free_port


def _config(data: Path, **extra: str) -> BrokerConfig:
    overrides = {
        "log.dirs": str(data),
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()}",
        "s3.wal.capacity": str(32 << 20),
        "s3.wal.upload.threshold": str(8 << 20),
        "offsets.topic.num.partitions": "5",
        "group.initial.rebalance.delay.ms": "0",
        **extra,
    }
    return BrokerConfig.load(None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[tuple[Broker, Path]]:
    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:
        yield broker, tmp_path / "data"
    finally:
        await broker.stop()


@contextlib.asynccontextmanager
async def _restarted(data: Path) -> AsyncIterator[Broker]:
    """A broker started again on ``data``, given a moment to load its groups."""
    again = Broker(_config(data))
    await again.start()
    try:
        await asyncio.sleep(0.3)
        yield again
    finally:
        await again.stop()


def _coordinator(broker: Broker) -> GroupCoordinator:
    assert broker.groups is not None
    return broker.groups


def _join(group: str, member: str = "", instance: str | None = None) -> JoinRequest:
    return JoinRequest(
        group_id=group,
        member_id=member,
        group_instance_id=instance,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"\x00\x01\x00\x00\x00\x01\x00\x01t")],
        require_known_member_id=False,
        supports_skip_assignment=True,
    )


async def _topic(broker: Broker, name: str, partitions: int) -> None:
    assert broker.server is not None
    await broker.server.apis.ctx.topics.create(name, partitions)


async def test_a_transactional_commit_is_taken_while_the_group_completes_its_rebalance(
    started: tuple[Broker, Path],
) -> None:
    """Between JoinGroup and the leader's SyncGroup an OffsetCommit is refused
    REBALANCE_IN_PROGRESS; a TxnOffsetCommit of a current member is not (Kafka's
    ``validateOffsetCommit``): the error would be fatal to the producer's transaction."""
    broker, _ = started
    await _topic(broker, "t", 1)
    groups = _coordinator(broker)
    joined = await groups.join_group(_join("g"))
    group = groups.groups["g"]
    assert isinstance(group, ClassicGroup) and group.is_(ClassicState.COMPLETING_REBALANCE)
    member = (joined.generation_id, joined.member_id, None)
    assert validate_commit(group, *member, 8) == ErrorCode.REBALANCE_IN_PROGRESS
    assert validate_commit(group, *member, 8, transactional=True) == ErrorCode.NONE
    # a stale generation is refused either way
    stale = (joined.generation_id - 1, joined.member_id, None)
    assert validate_commit(group, *stale, 8, transactional=True) == ErrorCode.ILLEGAL_GENERATION
    errors = await groups.offsets.commit("g", *member, [OffsetCommit("t", 0, 1, -1, None)], 8)
    assert errors == [ErrorCode.REBALANCE_IN_PROGRESS]


def test_an_epoch_minus_one_commit_to_an_empty_consumer_group_is_taken() -> None:
    """Kafka's ConsumerGroup.validateOffsetCommit: with no members, a commit at epoch -1 is
    the admin client's or an outside consumer's, whatever member id it carries."""
    group = ConsumerGroup("g")
    assert validate_commit(group, -1, "someone", None, 9) == ErrorCode.NONE
    assert validate_commit(group, 0, "someone", None, 9) == ErrorCode.UNKNOWN_MEMBER_ID


async def test_a_transactional_commit_names_a_generation_of_a_known_group_only(
    started: tuple[Broker, Path],
) -> None:
    """Kafka's validateTransactionalOffsetCommit: a generation of a group the coordinator does
    not know is ILLEGAL_GENERATION; at generation -1 the commit makes a simple group."""
    broker, _ = started
    await _topic(broker, "t", 1)
    offsets = _coordinator(broker).offsets
    commits = [OffsetCommit("t", 0, 5, -1, "")]
    refused = await offsets.commit_txn("nobody", 7000, 0, 1, "m", None, commits)
    assert refused == [ErrorCode.ILLEGAL_GENERATION]
    assert "nobody" not in _coordinator(broker).groups and not offsets.pending
    assert await offsets.commit_txn("simple", 7000, 0, -1, "", None, commits) == [ErrorCode.NONE]
    assert offsets.pending_partitions("simple") == {("t", 0)}


async def test_an_offset_deleted_while_its_transaction_is_open_is_not_committed_by_it(
    tmp_path: Path,
) -> None:
    """Kafka writes OffsetDelete's tombstone for an offset pending in a transaction too, and
    the tombstone drops it: the transaction's COMMIT no longer brings it back. So after a
    restart, replaying the records."""
    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:
        await _topic(broker, "t", 2)
        offsets = _coordinator(broker).offsets
        commits = [OffsetCommit("t", p, 5, -1, "") for p in range(2)]
        assert await offsets.commit_txn("g", 7000, 0, -1, "", None, commits) == [ErrorCode.NONE] * 2
        assert await offsets.delete("g", [("t", 0)]) == (ErrorCode.NONE, [ErrorCode.NONE])
        assert offsets.pending_partitions("g") == {("t", 1)}
    finally:
        await broker.stop()
    async with _restarted(tmp_path / "data") as again:
        offsets = _coordinator(again).offsets
        await offsets.fetch("g", None)  # (waits for the group's partition to load)
        assert offsets.pending_partitions("g") == {("t", 1)}
        offsets.complete_transaction(7000, commit=True)
        error, found = await offsets.fetch("g", None)
        assert error == ErrorCode.NONE
        assert [(tp, v.offset if v else None) for tp, v in found] == [(("t", 1), 5)]


async def test_a_marker_settles_the_transactional_offsets_of_its_partition_s_groups(
    tmp_path: Path,
) -> None:
    """As Kafka settles pending offsets by the marker's partitions: a transaction's marker on
    one offsets partition commits the offsets of the groups that live there, not yet those
    of a group whose partition has no marker, when it is written and when it is read back."""
    there = next(g for g in (f"g-{i}" for i in range(100)) if partition_for(g, 5) != 0)
    here = next(g for g in (f"g-{i}" for i in range(100)) if partition_for(g, 5) == 0)

    async def committed(offsets: OffsetManager, group: str) -> list[tuple[Any, int | None]]:
        _, found = await offsets.fetch(group, None)
        return [(tp, v.offset if v else None) for tp, v in found]

    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:
        await _topic(broker, "t", 1)
        groups = _coordinator(broker)
        commits = [OffsetCommit("t", 0, 9, -1, "")]
        for group in (here, there):
            written = await groups.offsets.commit_txn(group, 7000, 0, -1, "", None, commits)
            assert written == [ErrorCode.NONE]
        # the marker reaches the first group's partition only (the broker stops before the
        # other's is written)
        partition = await groups.runtime.partition(here)
        started = await partition.append_marker(7000, 0, 0, True)
        assert not isinstance(started, AppendResult)
        await started.durable
        groups.offsets.complete_transaction(7000, commit=True, partition=0)
        assert await committed(groups.offsets, here) == [(("t", 0), 9)]
        assert await committed(groups.offsets, there) == []
    finally:
        await broker.stop()
    async with _restarted(tmp_path / "data") as again:
        offsets = _coordinator(again).offsets
        assert await committed(offsets, here) == [(("t", 0), 9)]
        assert await committed(offsets, there) == []
        assert offsets.pending_partitions(there) == {("t", 0)}


async def test_offsets_and_groups_come_back_after_a_restart(
    started: tuple[Broker, Path],
) -> None:
    broker, data = started
    await _topic(broker, "t", 3)
    groups = _coordinator(broker)
    joined = await groups.join_group(_join("g1", instance="i1"))
    assert joined.error == ErrorCode.NONE and joined.leader == joined.member_id
    synced = await groups.sync_group(
        "g1", joined.generation_id, joined.member_id, "i1", None, None, {joined.member_id: b"A"}
    )
    assert synced.error == ErrorCode.NONE and synced.assignment == b"A"
    commits = [OffsetCommit("t", p, 10 * p + 1, 4, f"m{p}") for p in range(3)]
    errors = await groups.offsets.commit(
        "g1", joined.generation_id, joined.member_id, "i1", commits, 8
    )
    assert errors == [ErrorCode.NONE] * 3
    # a commit outside any group membership makes a "simple" group
    assert await groups.offsets.commit(
        "simple", -1, "", None, [OffsetCommit("t", 0, 5, -1, None)], 8
    ) == [ErrorCode.NONE]
    await broker.stop()

    again = Broker(_config(data))
    await again.start()
    try:
        groups = _coordinator(again)
        for _ in range(50):
            error, found = await groups.offsets.fetch("g1", None)
            if error != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            await asyncio.sleep(0.05)
        assert error == ErrorCode.NONE
        assert [(tp, v.offset, v.leader_epoch, v.metadata) for tp, v in found if v] == [
            (("t", p), 10 * p + 1, 4, f"m{p}") for p in range(3)
        ]
        group = groups.groups["g1"]
        # the stable group is back with its member, generation and assignment: the member
        # keeps heartbeating as if nothing happened
        assert isinstance(group, ClassicGroup) and group.is_(ClassicState.STABLE)
        assert group.generation_id == joined.generation_id
        assert group.members[joined.member_id].assignment == b"A"
        assert group.static_members == {"i1": joined.member_id}
        assert (
            await groups.heartbeat("g1", joined.generation_id, joined.member_id, "i1")
            == ErrorCode.NONE
        )
        error, simple = await groups.offsets.fetch("simple", [("t", 0), ("t", 1)])
        assert [(tp, v.offset if v else None) for tp, v in simple] == [
            (("t", 0), 5),
            (("t", 1), None),
        ]
    finally:
        await again.stop()


async def test_deleted_groups_stay_deleted(started: tuple[Broker, Path]) -> None:
    broker, data = started
    await _topic(broker, "t", 1)
    groups = _coordinator(broker)
    await groups.offsets.commit("gone", -1, "", None, [OffsetCommit("t", 0, 1, -1, "")], 8)
    assert await groups.delete_groups(["gone", "never"]) == [
        ErrorCode.NONE,
        ErrorCode.GROUP_ID_NOT_FOUND,
    ]
    await broker.stop()
    async with _restarted(data) as again:
        error, listed = await _coordinator(again).list_groups()
        assert error == ErrorCode.NONE and listed == []


async def test_offset_retention(tmp_path: Path) -> None:
    broker = Broker(_config(tmp_path / "data", **{"offsets.retention.minutes": "1"}))
    await broker.start()
    try:
        await _topic(broker, "t", 2)
        groups = _coordinator(broker)
        commits = [OffsetCommit("t", p, 7, -1, "") for p in range(2)]
        assert await groups.offsets.commit("old", -1, "", None, commits, 8) == [ErrorCode.NONE] * 2
        assert await groups.offsets.commit("new", -1, "", None, commits, 8) == [ErrorCode.NONE] * 2
        # age the first group's commits past the one-minute retention
        stored = groups.offsets.committed["old"]
        for tp, value in stored.items():
            stored[tp] = type(value)(value.offset, -1, "", value.commit_timestamp - 61_000)
        assert await groups.offsets.expire() == 2
        assert "old" not in groups.groups and "new" in groups.groups
        assert await groups.offsets.expire() == 0
    finally:
        await broker.stop()
    # the expiry was written: after a restart the group is still gone
    async with _restarted(tmp_path / "data") as again:
        error, listed = await _coordinator(again).list_groups()
        assert error == ErrorCode.NONE
        assert [g.group_id for g in listed] == ["new"]
        assert _coordinator(again).topics.get(OFFSETS_TOPIC) is not None


async def test_an_empty_group_with_no_offsets_is_deleted(started: tuple[Broker, Path]) -> None:
    """As Kafka's cleanupGroupMetadata: a group with no members and no offsets (a join refused
    MEMBER_ID_REQUIRED, a consumer that never committed) is deleted at the next sweep, and stays
    deleted; one with offsets is kept until they expire."""
    broker, _ = started
    await _topic(broker, "t", 1)
    groups = _coordinator(broker)
    refused = await groups.join_group(replace(_join("idle"), require_known_member_id=True))
    assert refused.error == ErrorCode.MEMBER_ID_REQUIRED
    await groups.offsets.commit("kept", -1, "", None, [OffsetCommit("t", 0, 1, -1, "")], 8)
    assert {"idle", "kept"} <= set(groups.groups)
    assert await groups.offsets.expire() == 0
    assert "idle" not in groups.groups and "kept" in groups.groups
    error, listed = await groups.list_groups()
    assert error == ErrorCode.NONE and [g.group_id for g in listed] == ["kept"]


async def test_offsets_of_a_deleted_topic_are_forgotten(started: tuple[Broker, Path]) -> None:
    broker, _ = started
    await _topic(broker, "keep", 1)
    await _topic(broker, "drop", 2)
    groups = _coordinator(broker)
    commits = [OffsetCommit("keep", 0, 3, -1, ""), OffsetCommit("drop", 1, 4, -1, "")]
    assert await groups.offsets.commit("g", -1, "", None, commits, 8) == [ErrorCode.NONE] * 2
    await groups.offsets.delete_topic("drop")
    error, found = await groups.offsets.fetch("g", None)
    assert error == ErrorCode.NONE and [tp for tp, _ in found] == [("keep", 0)]


async def test_a_new_offsets_topic_loads_the_partition_a_request_waits_for_first(
    tmp_path: Path,
) -> None:
    broker = Broker(_config(tmp_path / "data", **{"offsets.topic.num.partitions": "30"}))
    await broker.start()
    try:
        runtime = _coordinator(broker).runtime
        # FindCoordinator creates the topic; it does not wait for its 30 partitions' streams
        assert await _coordinator(broker).find_coordinator() == ErrorCode.NONE
        assert len(runtime._loaded) < 30
        group = next(g for g in (f"group-{i}" for i in range(100)) if partition_for(g, 30) >= 20)
        # a request for a group waits for the group's partition, loaded next, and no other
        assert await runtime.ready(group) == ErrorCode.NONE
        assert partition_for(group, 30) in runtime._loaded
        assert len(runtime._loaded) < 10
        assert await runtime.all_ready() == ErrorCode.NONE
        assert runtime._loaded == set(range(30))
    finally:
        await broker.stop()


async def test_an_offsets_partition_that_fails_to_load_at_start_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:  # the offsets topic made, and a group stored in it
        groups = _coordinator(broker)
        joined = await groups.join_group(_join("g"))
        synced = await groups.sync_group(
            "g", joined.generation_id, joined.member_id, None, None, None, {joined.member_id: b"A"}
        )
        assert synced.error == ErrorCode.NONE
    finally:
        await broker.stop()

    monkeypatch.setattr("automq_py.coordinator.runtime.LOAD_RETRY_S", 0.2)
    real = CoordinatorRuntime._replay_partition
    failed: list[int] = []

    async def fail_once(runtime: CoordinatorRuntime, topic: TopicInfo, index: int) -> None:
        if index == partition_for("g", 5) and not failed:
            failed.append(index)
            raise OSError("object store down")
        await real(runtime, topic, index)

    monkeypatch.setattr(CoordinatorRuntime, "_replay_partition", fail_once)
    again = Broker(_config(tmp_path / "data"))
    await again.start()
    try:  # loaded at start, in the background: the failed partition is loaded on a retry
        runtime = _coordinator(again).runtime
        for _ in range(100):
            if await runtime.ready("g") != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            await asyncio.sleep(0.05)
        assert failed
        assert await runtime.ready("g") == ErrorCode.NONE
        error, group = await _coordinator(again).describe_group("g")
        assert error == ErrorCode.NONE and group is not None
    finally:
        await again.stop()


async def test_a_request_waits_a_while_for_its_partition_loading_after_a_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition moved to a broker, or found at its start, loads in the background: a
    request for one of its keys waits up to LOAD_WAIT_S for the load rather than being told
    COORDINATOR_LOAD_IN_PROGRESS at once (an error some clients' admin calls do not retry)."""
    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:
        joined = await _coordinator(broker).join_group(_join("g"))
        assert joined.error == ErrorCode.NONE
    finally:
        await broker.stop()

    monkeypatch.setattr("automq_py.coordinator.runtime.LOAD_WAIT_S", 0.5)
    real = CoordinatorRuntime._replay_partition
    delay = {"s": 0.2}

    async def slow(runtime: CoordinatorRuntime, topic: TopicInfo, index: int) -> None:
        if index == partition_for("g", 5):
            await asyncio.sleep(delay["s"])
        await real(runtime, topic, index)

    monkeypatch.setattr(CoordinatorRuntime, "_replay_partition", slow)
    again = Broker(_config(tmp_path / "data"))
    await again.start()
    try:  # loading for 0.2 s: the request waits and is answered
        runtime = _coordinator(again).runtime
        assert partition_for("g", 5) not in runtime._loaded
        assert await runtime.ready("g") == ErrorCode.NONE
        assert await runtime.all_ready() == ErrorCode.NONE
    finally:
        await again.stop()

    delay["s"] = 5.0
    third = Broker(_config(tmp_path / "data"))
    await third.start()
    try:  # a load longer than the wait: answered COORDINATOR_LOAD_IN_PROGRESS after it
        runtime = _coordinator(third).runtime
        started = asyncio.get_running_loop().time()
        assert await runtime.ready("g") == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert await runtime.all_ready() == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert 0.9 < asyncio.get_running_loop().time() - started < 2.5
        # except where Kafka 3.9 answers otherwise, for clients that predate the error: a
        # SyncGroup is told to join again (the rebalance under way is lost), a Heartbeat is
        # answered blindly
        groups = _coordinator(third)
        synced = await groups.sync_group(
            "g", joined.generation_id, joined.member_id, None, "consumer", "range", {}
        )
        assert synced.error == ErrorCode.REBALANCE_IN_PROGRESS
        beat = await groups.heartbeat("g", joined.generation_id, joined.member_id, None)
        assert beat == ErrorCode.NONE
    finally:
        await third.stop()


async def test_a_new_offsets_topic_partition_that_fails_to_load_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("automq_py.coordinator.runtime.LOAD_RETRY_S", 0.2)
    broker = Broker(_config(tmp_path / "data"))
    await broker.start()
    try:
        runtime = _coordinator(broker).runtime
        real = runtime._load_partition
        failed: list[int] = []

        async def fail_once(topic: TopicInfo, index: int) -> None:
            if index == partition_for("g", 5) and not failed:
                failed.append(index)
                raise OSError("object store down")
            await real(topic, index)

        monkeypatch.setattr(runtime, "_load_partition", fail_once)
        assert await _coordinator(broker).find_coordinator() == ErrorCode.NONE
        assert await runtime.ready("g") == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert failed
        assert await runtime.all_ready() == ErrorCode.NONE
        assert await runtime.ready("g") == ErrorCode.NONE
    finally:
        await broker.stop()


async def _consumer_heartbeat(
    broker: Broker,
    group_id: str,
    member_id: str,
    epoch: int,
    topics: list[str],
    store: bool = True,
) -> tuple[ErrorCode, int, dict[uuid.UUID, frozenset[int]] | None]:
    """One ConsumerGroupHeartbeat as the API handler runs it: applied, then stored."""
    groups = _coordinator(broker)
    error, group, _ = await groups.consumer_group(group_id)
    assert error == ErrorCode.NONE and group is not None
    assert broker.server is not None
    registry = broker.server.apis.ctx.topics

    def resolve(wanted: set[str]) -> dict[str, tuple[uuid.UUID, int]]:
        found = {name: registry.get(name) for name in wanted}
        return {n: (t.topic_id, t.partitions) for n, t in found.items() if t is not None}

    # a client reports what it owns: what it was given, less what it was asked to revoke
    member = group.members.get(member_id)
    owned = dict(member.assigned) if member is not None and epoch > 0 else {}
    request = HeartbeatRequest(
        group_id, member_id, epoch, None, "rack-a", 30_000, topics, None, None, owned, "c", "h"
    )
    result = group.heartbeat(request, groups.clock(), resolve, (), ["uniform"], 45_000, 100)
    if result.error == ErrorCode.NONE:
        groups.add_consumer_group(group)
        if store:
            assert await groups.store_consumer_group(group) == ErrorCode.NONE
    return result.error, result.member_epoch, result.assignment


async def test_a_consumer_group_keeps_its_members_where_its_partition_loads_again(
    started: tuple[Broker, Path],
) -> None:
    """KIP-848: a group's members, their epochs and partitions, and its target assignment are
    in the log, so the broker that loads the group's partition next (a restart here, another
    broker when it moves) knows them: the members go on heartbeating and committing at their
    epochs, with the partitions they have, and no rebalance."""
    broker, data = started
    await _topic(broker, "t", 4)
    for member in ("m1", "m2"):
        error, epoch, _ = await _consumer_heartbeat(broker, "g848", member, 0, ["t"])
        assert error == ErrorCode.NONE
    # both heartbeat again until each holds its target
    for _ in range(3):
        for member in ("m1", "m2"):
            group = _coordinator(broker).groups["g848"]
            assert isinstance(group, ConsumerGroup)
            epoch = group.members[member].epoch
            error, _, _ = await _consumer_heartbeat(broker, "g848", member, epoch, ["t"])
            assert error == ErrorCode.NONE
    before = _coordinator(broker).groups["g848"]
    assert isinstance(before, ConsumerGroup) and before.state == "Stable"
    held = {m.member_id: (m.epoch, m.assigned) for m in before.members.values()}
    assert sum(len(p) for _, a in held.values() for p in a.values()) == 4
    # a member leaves for good: its records go with it
    error, _, _ = await _consumer_heartbeat(broker, "g848", "m2", -1, ["t"])
    assert error == ErrorCode.NONE
    await _consumer_heartbeat(broker, "g848", "m1", held["m1"][0], ["t"])
    after_leave = before.group_epoch
    m1 = before.members["m1"]
    held_m1 = (m1.epoch, m1.assigned, m1.state)
    await broker.stop()

    again = Broker(_config(data))
    await again.start()
    try:
        groups = _coordinator(again)
        for _ in range(50):
            if await groups.runtime.ready("g848") != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            await asyncio.sleep(0.05)
        group = groups.groups["g848"]
        assert isinstance(group, ConsumerGroup)
        assert set(group.members) == {"m1"}
        loaded = group.members["m1"]
        assert (loaded.epoch, loaded.assigned, loaded.state) == held_m1
        assert (loaded.rack_id, loaded.subscribed_names) == ("rack-a", frozenset({"t"}))
        assert group.group_epoch == after_leave
        assert group.validate_member_epoch("m1", loaded.epoch) == ErrorCode.NONE
        # its next heartbeat at its epoch is answered as before the move, with no new epoch
        error, epoch, _ = await _consumer_heartbeat(
            again, "g848", "m1", loaded.epoch, ["t"], store=False
        )
        assert (error, epoch) == (ErrorCode.NONE, held_m1[0])
        assert group.group_epoch == after_leave
        # and nothing is written again for what the log already holds
        assert group.changed_records() == []
    finally:
        await again.stop()


async def _stable_statics(
    groups: GroupCoordinator, group_id: str, rebalance_timeout_ms: int
) -> tuple[str, str]:
    """Static members ``a`` (the leader) and ``b`` of a stable classic group: their ids."""
    a_join = dataclasses.replace(
        _join(group_id, instance="a"), rebalance_timeout_ms=rebalance_timeout_ms
    )
    a = await groups.join_group(a_join)
    assert a.error == ErrorCode.NONE and a.leader == a.member_id
    assert (await groups.sync_group(group_id, 1, a.member_id, "a", None, None, {})).error == 0
    b_join = dataclasses.replace(a_join, group_instance_id="b")
    b_task = asyncio.create_task(groups.join_group(b_join))
    group = groups.groups[group_id]
    assert isinstance(group, ClassicGroup)
    for _ in range(200):  # b's join starts the rebalance a rejoins
        if group.is_(ClassicState.PREPARING_REBALANCE):
            break
        await asyncio.sleep(0.01)
    a_again = await groups.join_group(dataclasses.replace(a_join, member_id=a.member_id))
    b = await b_task
    assert a_again.leader == b.leader == a.member_id and a_again.generation_id == 2
    synced = await asyncio.gather(
        groups.sync_group(group_id, 2, a.member_id, "a", None, None, {}),
        groups.sync_group(group_id, 2, b.member_id, "b", None, None, {}),
    )
    assert [s.error for s in synced] == [ErrorCode.NONE] * 2
    return a.member_id, b.member_id


async def test_a_static_follower_rejoining_is_told_who_leads(started: tuple[Broker, Path]) -> None:
    """A static member that comes back under a new id to a stable group keeps its assignment,
    and its JoinGroup answer names the group's leader (Kafka's
    updateStaticMemberThenRebalanceOrCompleteJoin), not itself: a client that took itself for
    the leader would assign again."""
    broker, _ = started
    groups = _coordinator(broker)
    a, b = await _stable_statics(groups, "statics", 10_000)
    again = await groups.join_group(_join("statics", instance="b"))
    assert again.error == ErrorCode.NONE and again.member_id != b
    assert (again.leader, again.skip_assignment, again.generation_id) == (a, False, 2)


async def test_a_static_member_that_does_not_rejoin_stays_until_it_fails_to_sync(
    started: tuple[Broker, Path],
) -> None:
    """Kafka's completeClassicGroupJoin keeps a static member that did not rejoin in the next
    generation (its process may be restarting), with the leadership passed to one that did;
    if it then sends no SyncGroup within the rebalance timeout, also once the group is
    stable, it is removed and the group rebalances (expirePendingSync)."""
    broker, _ = started
    groups = _coordinator(broker)
    a, b = await _stable_statics(groups, "keeps", 1000)
    # b changes its protocols: a rebalance, which a (the leader) does not join
    changed = dataclasses.replace(
        _join("keeps", b, "b"), rebalance_timeout_ms=1000, protocols=[("range", b"\x00\x01")]
    )
    joined = await groups.join_group(changed)
    assert joined.error == ErrorCode.NONE and joined.generation_id == 3
    assert joined.leader == b  # the leader rejoined not: the one who did leads
    assert {m for m, _, _ in joined.members} == {a, b}  # a is still a member
    group = groups.groups["keeps"]
    assert isinstance(group, ClassicGroup)
    assert (await groups.sync_group("keeps", 3, b, "b", None, None, {})).error == ErrorCode.NONE
    assert group.is_(ClassicState.STABLE) and group.pending_sync == {a}
    assert group.sync_deadline is not None
    groups.classic.expire(group, group.sync_deadline)
    assert set(group.members) == {b} and group.is_(ClassicState.PREPARING_REBALANCE)


@contextlib.asynccontextmanager
async def _running(data: Path) -> AsyncIterator[Broker]:
    """A broker on ``data`` (started again on what an earlier one left), stopped after."""
    broker = Broker(_config(data))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def _loaded(broker: Broker, group_id: str) -> object:
    groups = _coordinator(broker)
    for _ in range(50):
        if await groups.runtime.ready(group_id) != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            break
        await asyncio.sleep(0.05)
    return groups.groups.get(group_id)


async def test_a_group_that_changed_protocol_is_loaded_as_it_was_left(tmp_path: Path) -> None:
    """KIP-848's online migration writes each conversion to the log: a classic group that a
    consumer-protocol member upgraded loads as a consumer-protocol group whose classic member
    keeps its protocols and partitions; once that member left, the group loads as a classic
    group again, at the generation its member was at."""
    data = tmp_path / "data"
    async with _running(data) as broker:
        await _topic(broker, "t", 4)
        groups = _coordinator(broker)
        # a ConsumerProtocolSubscription v0 of topic t, as a client sends it whole
        subscription = b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"
        request = dataclasses.replace(_join("mig"), protocols=[("range", subscription)])
        joined = await groups.join_group(request)
        assert joined.error == ErrorCode.NONE and joined.leader == joined.member_id
        everything = serialize_assignment([("t", range(4))], 1)
        synced = await groups.sync_group(
            "mig",
            joined.generation_id,
            joined.member_id,
            None,
            None,
            None,
            {joined.member_id: everything},
        )
        assert synced.error == ErrorCode.NONE
        error, _, _ = await _consumer_heartbeat(broker, "mig", "new", 0, ["t"])
        assert error == ErrorCode.NONE
        upgraded = groups.groups["mig"]
        assert isinstance(upgraded, ConsumerGroup)
        classic_id = joined.member_id
        assert sum(len(p) for p in upgraded.members[classic_id].assigned.values()) == 4
        # told to rejoin, it does (an eager client owns nothing by then), then the coordinator
        # moves before its SyncGroup
        beat = await groups.heartbeat("mig", joined.generation_id, classic_id, None)
        assert beat == ErrorCode.REBALANCE_IN_PROGRESS
        rejoined = await groups.join_group(dataclasses.replace(request, member_id=classic_id))
        assert rejoined.error == ErrorCode.NONE and rejoined.leader == ""
        held = upgraded.members[classic_id].assigned
        assert sum(len(p) for p in held.values()) == 2

    async with _running(data) as broker:
        group = await _loaded(broker, "mig")
        assert isinstance(group, ConsumerGroup)
        member = group.members[classic_id]
        assert member.classic is not None
        assert member.classic.protocols == (("range", subscription),)
        assert member.assigned == held and member.epoch == rejoined.generation_id
        synced = await _coordinator(broker).sync_group(
            "mig", rejoined.generation_id, classic_id, None, "consumer", "range", {}
        )
        assert synced.error == ErrorCode.NONE
        assignment = parse_assignment(synced.assignment).partitions
        assert len(assignment["t"]) == 2 and set(assignment) == {"t"}
        # the consumer-protocol member leaves: the group is classic again
        error, _, _ = await _consumer_heartbeat(broker, "mig", "new", -1, ["t"])
        assert error == ErrorCode.NONE
        back = _coordinator(broker).groups["mig"]
        assert isinstance(back, ClassicGroup) and back.is_(ClassicState.PREPARING_REBALANCE)

    async with _running(data) as broker:
        group = await _loaded(broker, "mig")
        assert isinstance(group, ClassicGroup) and set(group.members) == {classic_id}
        assert group.generation_id == rejoined.generation_id
        # it holds its target, by name, as the classic group's record keeps it
        assert parse_assignment(group.members[classic_id].assignment).partitions == assignment
        assert group.protocol_type == "consumer" and group.protocol_name == "range"


async def test_a_commit_that_lands_as_its_partition_is_unloaded_is_left_to_the_new_leader(
    started: tuple[Broker, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offsets partition is led elsewhere while a commit's record is being written (it
    lands in the stream the new leader loads): the commit is answered, but this broker keeps
    no group or offsets for it, which would come back stale should leadership return."""
    broker, _ = started
    await _topic(broker, "t", 1)
    groups = _coordinator(broker)
    assert await groups.offsets.commit(
        "g", -1, "", None, [OffsetCommit("t", 0, 5, -1, None)], 8
    ) == [ErrorCode.NONE]
    partition = partition_for("g", 5)
    real = CoordinatorRuntime.append

    async def unloaded_meanwhile(self: CoordinatorRuntime, *args: object, **kw: object) -> object:
        error = await real(self, *args, **kw)  # type: ignore[arg-type]
        monkeypatch.setattr(self, "leads", lambda index: index != partition)
        groups.partition_unloaded(partition)
        return error

    monkeypatch.setattr(CoordinatorRuntime, "append", unloaded_meanwhile)
    assert await groups.offsets.commit(
        "g", -1, "", None, [OffsetCommit("t", 0, 7, -1, None)], 8
    ) == [ErrorCode.NONE]
    assert "g" not in groups.groups and "g" not in groups.offsets.committed
