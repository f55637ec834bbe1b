"""kafkajs 2.2.4 consumer groups (the classic protocol) against the real broker process.

Each member is one ``node tests/js/groups.js`` process: a kafkajs consumer with auto-commit that
prints its joins (generation, assignment), every record it consumes, and every commit the
broker acknowledged, as JSON lines. The tests start, stop (LeaveGroup) and kill (no LeaveGroup)
members while records flow, and check the group's assignments, that no record is lost or
consumed twice, and the committed offsets, also across a broker kill -9.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

PARTITIONS = 6
SCRIPT = Path(__file__).resolve().parents[2] / "js" / "groups.js"

Event = dict[str, Any]
Position = tuple[int, int]  # partition, offset


class Members:
    """kafkajs members of one group, one node process each; their events in arrival order."""

    def __init__(self, bootstrap: str, topic: str, group: str, log_dir: Path) -> None:
        node = shutil.which("node")
        assert node is not None, "node is not installed"
        assert (SCRIPT.parent / "node_modules" / "kafkajs").is_dir(), "run `make deps` first"
        self.args = [node, str(SCRIPT), bootstrap, topic, group]
        self.log_dir = log_dir
        self.events: list[Event] = []
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._readers: dict[str, threading.Thread] = {}
        self._changed = threading.Condition()

    def start(self, name: str, delay_ms: int = 0) -> None:
        stderr = open(self.log_dir / f"kafkajs-{name}.log", "ab")  # noqa: SIM115 - child's
        process = subprocess.Popen(
            [*self.args, name, str(delay_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        self.processes[name] = process
        self._readers[name] = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._readers[name].start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    def stop(self, name: str) -> None:
        """Disconnect the member (commit, LeaveGroup) and wait for its process to exit 0."""
        process = self.processes.pop(name)
        assert process.stdin is not None
        process.stdin.write(b"stop\n")
        process.stdin.flush()
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"member {name} did not disconnect within 30 s") from None
        self._readers.pop(name).join(10)  # every line it printed is in self.events
        assert code == 0, f"member {name} exited with {code}:\n{self.log_tail(name)}"

    def kill(self, name: str) -> None:
        """SIGKILL the member: no commit, no LeaveGroup; the broker must expire its session."""
        process = self.processes.pop(name)
        process.kill()
        process.wait()
        self._readers.pop(name).join(10)

    def close(self) -> None:
        """Kill the members still running; keep their events next to their logs."""
        for name in list(self.processes):
            self.kill(name)
        with open(self.log_dir / "kafkajs-events.jsonl", "a") as out, self._changed:
            out.writelines(json.dumps(e) + "\n" for e in self.events)

    def wait_for(self, what: str, condition: Callable[[list[Event]], Any], timeout: float) -> Any:
        """Wait until ``condition(events)`` is truthy and return it; fail saying ``what``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (result := condition(self.events)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
                self._changed.wait(min(left, 0.5))
            return result

    def snapshot(self) -> list[Event]:
        with self._changed:
            return list(self.events)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.snapshot() if e["event"] == kind]

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"kafkajs-{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


MembersOf = Callable[[str, str, str], Members]  # bootstrap, topic, group


@pytest.fixture
def members_of(tmp_path: Path) -> Iterator[MembersOf]:
    """Makes Members; whatever is still running at the end is killed."""
    made: list[Members] = []

    def make(bootstrap: str, topic: str, group: str) -> Members:
        made.append(Members(bootstrap, topic, group, tmp_path))
        return made[-1]

    yield make
    for members in made:
        members.close()


def settled(names: set[str], after: int = 0) -> Callable[[list[Event]], int | None]:
    """The generation in which exactly ``names`` own the partitions, once each has joined it:
    every member's latest join is that generation (newer than ``after``) and the members'
    assignments partition the topic."""

    def check(events: list[Event]) -> int | None:
        latest: dict[str, Event] = {}
        for e in events:
            if e["event"] == "join":
                latest[e["member"]] = e
        if not names <= latest.keys():
            return None
        generations = {latest[n]["generation"] for n in names}
        if len(generations) != 1 or (generation := generations.pop()) <= after:
            return None
        owned = [p for n in names for p in latest[n]["partitions"]]
        return generation if sorted(owned) == list(range(PARTITIONS)) else None

    return check


def consumed(events: list[Event]) -> set[Position]:
    return {(e["partition"], e["offset"]) for e in events if e["event"] == "record"}


def committed_by_members(events: list[Event]) -> dict[int, int]:
    """The highest offset per partition any member's acknowledged commit reached."""
    out: dict[int, int] = {}
    for e in events:
        if e["event"] == "commit":
            for p, offset in e["offsets"].items():
                out[int(p)] = max(out.get(int(p), 0), offset)
    return out


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(15)


def produce(bootstrap: str, topic: str, keys: range) -> dict[Position, str]:
    """Produce one record per key (the default partitioner picks the partition); returns the
    key each acknowledged (partition, offset) holds."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: dict[Position, str] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[(msg.partition(), msg.offset())] = msg.key().decode()

    for i in keys:
        producer.produce(topic, f"value-{i}".encode(), f"key-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0, "records still unacknowledged after 30 s"
    assert not errors, errors[:5]
    assert len(acked) == len(keys)
    return acked


def end_offsets(acked: dict[Position, str]) -> dict[int, int]:
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for p, offset in acked:
        ends[p] = max(ends[p], offset + 1)
    return ends


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as the broker returns them (OffsetFetch), retrying while
    the coordinator loads them (librdkafka's admin client does not retry that itself)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(PARTITIONS)]
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            result = admin.list_consumer_group_offsets([request])[group].result(15)
            break
        except KafkaException as e:
            loading = e.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
            if not loading or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def owners_by_generation(events: list[Event]) -> dict[int, dict[str, list[int]]]:
    out: dict[int, dict[str, list[int]]] = {}
    for e in events:
        if e["event"] == "join":
            out.setdefault(e["generation"], {})[e["member"]] = e["partitions"]
    return out


def check_generations(events: list[Event]) -> None:
    """No two members of a generation own one partition, and every record was consumed by a
    member that owned its partition in the generation it consumed it in."""
    owners = owners_by_generation(events)
    for generation, assignment in owners.items():
        owned = Counter(p for partitions in assignment.values() for p in partitions)
        shared = {p: n for p, n in owned.items() if n > 1}
        assert not shared, f"generation {generation}: partitions owned twice {assignment}"
    for e in events:
        if e["event"] == "record":
            mine = owners.get(e["generation"], {}).get(e["member"], [])
            assert e["partition"] in mine, f"{e} consumed outside its assignment {mine}"


def test_three_members_share_the_partitions(broker: BrokerProcess, members_of: MembersOf) -> None:
    """Three members started together land in the first generation (the default 3 s initial
    rebalance delay waits for them), each owns two partitions, each record reaches its owner."""
    create_topic(broker.bootstrap, "shared")
    acked = produce(broker.bootstrap, "shared", range(600))
    members = members_of(broker.bootstrap, "shared", "sharers")
    for name in ("a", "b", "c"):
        members.start(name)

    generation = members.wait_for("a, b and c to settle", settled({"a", "b", "c"}), 30)
    joins = members.of("join")
    assert [e["generation"] for e in joins] == [generation] * 3, (
        f"the initial rebalance delay did not gather the three members in one generation: {joins}"
    )
    assert sum(e["leader"] for e in joins) == 1, f"one leader expected: {joins}"
    assignment = {e["member"]: e["partitions"] for e in joins}
    assert sorted(map(len, assignment.values())) == [2, 2, 2], assignment

    members.wait_for("all 600 records", lambda events: consumed(events) >= acked.keys(), 30)
    records = members.of("record")
    assert len(records) == len(acked), "a record was consumed twice"
    for e in records:
        assert e["partition"] in assignment[e["member"]], f"{e} not from its member's partitions"
        assert acked[(e["partition"], e["offset"])] == e["key"], e

    # the broker's own view (DescribeGroups) agrees with what the members were told
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups(["sharers"])["sharers"].result(15)
    assert described.state.name == "STABLE", described.state
    assert described.partition_assignor == "RoundRobinAssigner", described.partition_assignor
    by_client = {
        m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
        for m in described.members
    }
    assert by_client == assignment, (by_client, assignment)
    for name in ("a", "b", "c"):
        members.stop(name)
    assert not members.of("crash"), members.of("crash")


N = 3000  # produced before the members start
TAIL = 600  # produced once d has joined, so that d has records to consume
DELAY_MS = 5  # per record and member: b departs while most records are still unconsumed
COMMIT_THRESHOLD = 50  # as in groups.js: kafkajs commits once this many offsets are pending


@pytest.mark.parametrize("departure", ["leave", "crash"])
def test_rebalances_lose_nothing(
    group_broker: BrokerProcess, members_of: MembersOf, departure: str
) -> None:
    """a, b and c consume; b leaves (LeaveGroup) or crashes (SIGKILL: the broker must expire its
    session) a quarter of the way in; d joins half way. Nothing is lost and nothing consumed
    twice, except after the crash: b's partitions resume at b's last acknowledged commit, so
    what b consumed after it comes again (at most COMMIT_THRESHOLD records)."""
    bootstrap, topic, group = group_broker.bootstrap, f"orders-{departure}", f"billing-{departure}"
    create_topic(bootstrap, topic)
    acked = produce(bootstrap, topic, range(N))
    assert all(end_offsets(acked).values()), f"a partition got no records: {end_offsets(acked)}"

    members = members_of(bootstrap, topic, group)
    for name in ("a", "b", "c"):
        members.start(name, DELAY_MS)
    first = members.wait_for("a, b and c to settle", settled({"a", "b", "c"}), 30)
    members.wait_for("a quarter of the records", lambda ev: len(consumed(ev)) >= N // 4, 30)
    if departure == "leave":
        members.stop("b")
    else:
        members.kill("b")
    assert len(consumed(members.snapshot())) < N // 2, "b left late; raise DELAY_MS"
    b_records = [e for e in members.of("record") if e["member"] == "b"]
    assert b_records, "b consumed nothing before it left: the test proves nothing"

    second = members.wait_for(
        "a and c to take over b's partitions", settled({"a", "c"}, after=first), 30
    )
    members.wait_for("half of the records", lambda ev: len(consumed(ev)) >= N // 2, 30)
    members.start("d", DELAY_MS)
    members.wait_for("d to join a and c", settled({"a", "c", "d"}, after=second), 30)
    acked |= produce(bootstrap, topic, range(N, N + TAIL))
    ends = end_offsets(acked)
    members.wait_for("every record", lambda ev: consumed(ev) >= acked.keys(), 60)
    members.wait_for(
        "the members' commits to reach the end offsets",
        lambda ev: committed_by_members(ev) == ends,
        30,
    )
    for name in ("a", "c", "d"):
        members.stop(name)

    assert not members.of("crash"), members.of("crash")
    events = members.snapshot()
    check_generations(events)
    records = members.of("record")
    for e in records:
        assert acked[(e["partition"], e["offset"])] == e["key"], e
    assert consumed(events) == acked.keys(), "consumed records that were never produced"
    assert any(e["member"] == "d" for e in records), "d consumed nothing"
    counts = Counter((e["partition"], e["offset"]) for e in records)
    duplicates = {pos: n for pos, n in counts.items() if n > 1}
    if departure == "leave":
        # kafkajs commits what it consumed before rejoining and before leaving
        assert not duplicates, f"consumed again ((partition, offset): times): {duplicates}"
    else:
        assert max(duplicates.values(), default=0) <= 2, "a record was consumed three times"
        assert duplicates.keys() == resumed_after_crash("b", first, events), sorted(duplicates)[:20]
        assert len(duplicates) <= COMMIT_THRESHOLD, len(duplicates)

    assert group_offsets(bootstrap, group, topic) == ends


def resumed_after_crash(name: str, generation: int, events: list[Event]) -> set[Position]:
    """The records the crashed member ``name`` consumed that its partitions' next owners
    consumed again. Each partition must resume at the member's last acknowledged commit, or
    just after its last record if a commit was in flight when it died (kafkajs commits every
    offset it resolved, and it resolves each record right after printing it)."""
    owned = owners_by_generation(events)[generation][name]
    again: set[Position] = set()
    for p in owned:
        records = [e for e in events if e["event"] == "record" and e["partition"] == p]
        mine = [e["offset"] for e in records if e["member"] == name]
        others = [e["offset"] for e in records if e["member"] != name]
        commits = [
            e["offsets"][str(p)]
            for e in events
            if e["event"] == "commit" and e["member"] == name and str(p) in e["offsets"]
        ]
        acknowledged = max(commits, default=0)  # the group had no offsets before generation 1
        after_last = max(mine, default=-1) + 1
        assert others, f"nobody consumed partition {p} after {name} crashed"
        assert others[0] in {acknowledged, after_last}, (
            f"partition {p} resumed at {others[0]}: {name}'s last acknowledged commit was "
            f"{acknowledged}, its last record {after_last - 1}"
        )
        again |= {(p, offset) for offset in mine if offset >= others[0]}
    return again


@pytest.mark.parametrize("before_kill", ["leave", "crash"])
def test_committed_offsets_survive_kill_9(
    group_broker: BrokerProcess, members_of: MembersOf, before_kill: str
) -> None:
    """A member consumes and commits 600 records, then leaves (LeaveGroup) or crashes (the
    broker then reloads it as a member whose session must expire); 300 more records arrive; the
    broker is killed (-9) and restarted; a new member of the group consumes exactly the 300."""
    bootstrap, topic, group = group_broker.bootstrap, f"ledger-{before_kill}", "auditors"
    create_topic(bootstrap, topic)
    first = produce(bootstrap, topic, range(600))
    members = members_of(bootstrap, topic, group)
    members.start("a")
    members.wait_for("a to consume the 600", lambda ev: consumed(ev) >= first.keys(), 30)
    members.wait_for(
        "a's commits to reach the end offsets",
        lambda ev: committed_by_members(ev) == end_offsets(first),
        30,
    )
    if before_kill == "leave":
        members.stop("a")
    else:
        members.kill("a")
    committed = group_offsets(bootstrap, group, topic)
    assert committed == end_offsets(first), "a's acknowledged commits"

    second = produce(bootstrap, topic, range(600, 900))
    group_broker.kill()
    group_broker.start()
    assert group_offsets(bootstrap, group, topic) == committed, "lost by kill -9"

    members.start("b")
    # after a crash, b's join waits for a's session (6 s) to expire
    members.wait_for("b to consume the 300", lambda ev: consumed(ev) >= second.keys(), 45)
    members.stop("b")
    from_b = [e for e in members.of("record") if e["member"] == "b"]
    assert sorted((e["partition"], e["offset"]) for e in from_b) == sorted(second), (
        "b did not resume exactly at the committed offsets"
    )
    for e in from_b:
        assert second[(e["partition"], e["offset"])] == e["key"], e
    assert group_offsets(bootstrap, group, topic) == end_offsets({**first, **second})
    assert not members.of("crash"), members.of("crash")
