"""Consumer groups of real clients against the real broker process: confluent-kafka (classic
and KIP-848 ``group.protocol=consumer``), kafka-python and aiokafka split a topic, rebalance
without losing or repeating records, keep static members across a restart, and resume from
offsets that survived a kill -9.

Each member runs on its own thread, as if it were its own process, so the members of a group
poll concurrently (aiokafka's members each run their own event loop there). One broker serves
the tests that do not kill it, each with its own topic and group."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, NewTopic

from tests.automq_py.conftest import FAST_GROUPS, MakeBroker, module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
# a synchronous commit refused with STALE_MEMBER_EPOCH is tried again this often, 0.1 s apart
STALE_EPOCH_RETRIES = 30
CLIENTS = ["confluent-classic", "confluent-consumer", "kafka-python", "aiokafka"]

Key = tuple[int, int]  # partition, offset


# --- members ------------------------------------------------------------------------------------


class Member(threading.Thread):
    """One consumer of a group. It processes a record by noting it (see ``consumed()``) and
    commits what it processed: asynchronously while it runs, synchronously for partitions
    being revoked, and synchronously before it closes."""

    def __init__(
        self, name: str, bootstrap: str, group: str, topic: str, instance_id: str | None = None
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.instance_id = instance_id
        self.assignment: frozenset[int] = frozenset()
        self.rebalances = 0  # rebalance callbacks (assigned, revoked or lost)
        self.lost = 0  # partitions taken away with no chance to commit
        self.error: BaseException | None = None
        self._consumed: list[tuple[int, int, bytes]] = []
        # next offset to commit per partition, for the partitions currently assigned
        self._processed: dict[int, int] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            self.consume_until_stopped()
        except BaseException as e:  # reported by stop() and by the waits
            self.error = e

    def consume_until_stopped(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 30) -> None:
        """Commit, close the consumer (leaving the group unless static) and end the thread."""
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not close within {timeout}s"
        if self.error is not None:
            raise AssertionError(f"{self.name} failed: {self.error!r}") from self.error

    def check(self) -> None:
        if self.error is not None or (not self.is_alive() and not self.stopping.is_set()):
            raise AssertionError(f"{self.name} stopped unexpectedly: {self.error!r}")

    def process(self, partition: int, offset: int, value: bytes) -> None:
        with self._lock:
            self._consumed.append((partition, offset, value))
            self._processed[partition] = offset + 1

    def consumed(self) -> list[tuple[int, int, bytes]]:
        with self._lock:
            return list(self._consumed)

    def processed(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        with self._lock:
            if partitions is None:
                return dict(self._processed)
            wanted = set(partitions)
            return {p: o for p, o in self._processed.items() if p in wanted}

    def give_up(self, partitions: Iterable[int]) -> dict[int, int]:
        """Forget the partitions (another member moves them on; if they come back, committing
        our old position would move their offset back) and return what to commit for them."""
        with self._lock:
            return {p: self._processed.pop(p) for p in set(partitions) if p in self._processed}


class ConfluentMember(Member):
    def __init__(self, *args: Any, protocol: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocol = protocol

    def consume_until_stopped(self) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "group.protocol": self.protocol,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        if self.protocol == "classic":
            # consumer-protocol members get these from the broker
            config["session.timeout.ms"] = SESSION_TIMEOUT_MS
            config["heartbeat.interval.ms"] = HEARTBEAT_INTERVAL_MS
        if self.instance_id is not None:
            config["group.instance.id"] = self.instance_id
        consumer = Consumer(config)

        def commit(offsets: dict[int, int], asynchronous: bool) -> None:
            if not offsets:
                return
            tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
            if asynchronous:
                consumer.commit(offsets=tps, asynchronous=True)
                return
            # A consumer-protocol member's commit can cross the heartbeat that moves it to its
            # next epoch (answered first): Kafka's coordinator answers STALE_MEMBER_EPOCH. The
            # Java consumer retries its own commits (auto-commit, commit before revocation) with
            # the new epoch; librdkafka hands the error to the application, which retries here.
            for attempt in range(STALE_EPOCH_RETRIES + 1):
                try:
                    consumer.commit(offsets=tps, asynchronous=False)
                    return
                except KafkaException as e:
                    error = e.args[0] if e.args else None
                    stale = isinstance(error, KafkaError) and (
                        error.code() == KafkaError.STALE_MEMBER_EPOCH
                    )
                    if not stale or attempt == STALE_EPOCH_RETRIES:
                        raise
                time.sleep(0.1)

        def on_assign(_: Consumer, partitions: list[TopicPartition]) -> None:
            self.rebalances += 1

        def on_revoke(_: Consumer, partitions: list[TopicPartition]) -> None:
            self.rebalances += 1
            commit(self.give_up(tp.partition for tp in partitions), asynchronous=False)

        def on_lost(_: Consumer, partitions: list[TopicPartition]) -> None:
            self.rebalances += 1
            self.lost += 1
            self.give_up(tp.partition for tp in partitions)

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        try:
            while not self.stopping.is_set():
                touched = set()
                for msg in consumer.consume(100, 0.2):
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    partition, offset, value = msg.partition(), msg.offset(), msg.value()
                    assert partition is not None and offset is not None and value is not None
                    self.process(partition, offset, value)
                    touched.add(partition)
                commit(self.processed(touched), asynchronous=True)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
            commit(self.processed(), asynchronous=False)
        finally:
            consumer.close()


class KafkaPythonMember(Member):
    def consume_until_stopped(self) -> None:
        from kafka import (  # type: ignore[import-untyped]
            AsyncConsumerRebalanceListener,
            KafkaConsumer,
            OffsetAndMetadata,
        )
        from kafka import TopicPartition as KafkaTopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            group_instance_id=self.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            max_poll_records=100,
        )
        member = self

        def offsets(processed: dict[int, int]) -> dict[Any, Any]:
            return {
                KafkaTopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1)
                for p, o in processed.items()
            }

        class Listener(AsyncConsumerRebalanceListener):
            # kafka-python runs listeners on its IO thread, where the blocking commit() is
            # refused: await the commit's future there instead
            async def on_partitions_revoked(self, revoked: set[Any]) -> None:
                member.rebalances += 1
                processed = member.give_up(tp.partition for tp in revoked)
                if processed:
                    await consumer.commit_async(offsets(processed))

            async def on_partitions_assigned(self, assigned: set[Any]) -> None:
                member.rebalances += 1

            async def on_partitions_lost(self, lost: set[Any]) -> None:
                member.rebalances += 1
                member.lost += 1
                member.give_up(tp.partition for tp in lost)

        consumer.subscribe([self.topic], listener=Listener())
        try:
            while not self.stopping.is_set():
                batch = consumer.poll(timeout_ms=200)
                for tp, records in batch.items():
                    for r in records:
                        self.process(tp.partition, r.offset, r.value)
                touched = self.processed(tp.partition for tp in batch)
                if touched:
                    consumer.commit_async(offsets(touched))
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
            processed = self.processed()
            if processed:
                consumer.commit(offsets(processed))
        finally:
            consumer.close()


class AiokafkaMember(Member):
    def consume_until_stopped(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        from aiokafka import (  # type: ignore[import-untyped]
            AIOKafkaConsumer,
            ConsumerRebalanceListener,
        )
        from aiokafka.errors import (  # type: ignore[import-untyped]
            CommitFailedError,
            IllegalStateError,
        )
        from aiokafka.structs import (  # type: ignore[import-untyped]
            TopicPartition as AioTopicPartition,
        )

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            group_instance_id=self.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        member = self

        def offsets(processed: dict[int, int]) -> dict[AioTopicPartition, int]:
            return {AioTopicPartition(self.topic, p): o for p, o in processed.items()}

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: set[AioTopicPartition]) -> None:
                member.rebalances += 1
                processed = member.give_up(tp.partition for tp in revoked)
                if processed:
                    await consumer.commit(offsets(processed))

            async def on_partitions_assigned(self, assigned: set[AioTopicPartition]) -> None:
                member.rebalances += 1

        await consumer.start()
        try:
            consumer.subscribe([self.topic], listener=Listener())
            while not self.stopping.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=100)
                for tp, records in batch.items():
                    for r in records:
                        assert r.value is not None
                        self.process(tp.partition, r.offset, r.value)
                touched = self.processed(tp.partition for tp in batch)
                try:
                    if touched:
                        await consumer.commit(offsets(touched))
                except (CommitFailedError, IllegalStateError):
                    # a rebalance began while this commit waited: the revoke listener
                    # committed the same positions before the partitions were given up
                    pass
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
            processed = self.processed()
            if processed:
                # aiokafka's stop() calls no revoke listener: commit before leaving
                await consumer.commit(offsets(processed))
        finally:
            await consumer.stop()


def new_member(
    client: str, broker: BrokerProcess, group: str, topic: str, name: str, **kwargs: Any
) -> Member:
    args = (name, broker.bootstrap, group, topic)
    if client == "confluent-classic":
        return ConfluentMember(*args, protocol="classic", **kwargs)
    if client == "confluent-consumer":
        return ConfluentMember(*args, protocol="consumer", **kwargs)
    if client == "kafka-python":
        return KafkaPythonMember(*args, **kwargs)
    assert client == "aiokafka"
    return AiokafkaMember(*args, **kwargs)


@contextmanager
def running(members: list[Member]) -> Iterator[list[Member]]:
    """Start the members; on the way out stop every member in the list (also those the test
    appended), without hiding the test's own failure behind a stop's."""
    for m in members:
        m.start()
    failures: list[AssertionError] = []
    try:
        yield members
    finally:
        for m in members:
            try:
                m.stop()
            except AssertionError as e:
                failures.append(e)
    if failures:
        raise failures[0]


# --- waits and views ----------------------------------------------------------------------------


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    describe: Callable[[], str],
    members: Iterable[Member] = (),
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for m in members:
            m.check()
        assert time.monotonic() < deadline, f"timed out after {timeout}s: {describe()}"
        time.sleep(0.1)


def is_even_split(assignments: list[frozenset[int]]) -> bool:
    """Every partition owned by exactly one member, and member sizes within one of another."""
    sizes = [len(a) for a in assignments]
    owned = sorted(p for a in assignments for p in a)
    return owned == list(range(PARTITIONS)) and max(sizes) - min(sizes) <= 1


def wait_settled(
    members: list[Member], broker: BrokerProcess, timeout: float = 45, quiet: float = 2
) -> list[frozenset[int]]:
    """Wait until the members' assignments split the partitions evenly with no overlap and
    have not changed for ``quiet`` seconds; return them."""
    deadline = time.monotonic() + timeout
    last: list[frozenset[int]] | None = None
    since = time.monotonic()
    while True:
        for m in members:
            m.check()
        now = time.monotonic()
        current = [m.assignment for m in members]
        if current != last:
            last, since = current, now
        elif is_even_split(current) and now - since >= quiet:
            return current
        assert now < deadline, (
            f"the group did not settle within {timeout}s; assignments "
            f"{[sorted(a) for a in current]}\n{broker.log_tail()}"
        )
        time.sleep(0.1)


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(15)


def new_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})


def produce(bootstrap: str, topic: str, records: Iterable[tuple[int, int]]) -> dict[Key, bytes]:
    return send(new_producer(bootstrap), topic, records)


def send(producer: Producer, topic: str, records: Iterable[tuple[int, int]]) -> dict[Key, bytes]:
    """Send (partition, index) records, the index as value; return the acked ones by offset."""
    acked: dict[Key, bytes] = {}
    errors: list[object] = []

    def on_delivery(err: object, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for partition, i in records:
        producer.produce(
            topic, str(i).encode(), f"k{i}".encode(), partition=partition, on_delivery=on_delivery
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "records still unacknowledged after 30s"
    assert not errors, errors[:5]
    return acked


class SteadyProducer(threading.Thread):
    """Keeps producing (about 400 records a second over all partitions) until stopped."""

    def __init__(self, bootstrap: str, topic: str, first: int) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.bootstrap, self.topic, self.first = bootstrap, topic, first
        self.acked: dict[Key, bytes] = {}
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            producer = new_producer(self.bootstrap)
            i = self.first
            while not self._stopping.is_set():
                batch = [(j % PARTITIONS, j) for j in range(i, i + 40)]
                self.acked |= send(producer, self.topic, batch)
                i += len(batch)
                time.sleep(0.1)
        except BaseException as e:
            self.error = e

    def stop(self) -> dict[Key, bytes]:
        self._stopping.set()
        self.join(60)
        assert not self.is_alive(), "the producer did not stop within 60s"
        assert self.error is None, f"the producer failed: {self.error!r}"
        return self.acked


def describe_group(bootstrap: str, group: str) -> ConsumerGroupDescription:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description: ConsumerGroupDescription = admin.describe_consumer_groups([group])[group].result(
        15
    )
    return description


def committed_offsets(
    bootstrap: str, group: str, topic: str, timeout: float = 30
) -> dict[int, int]:
    """The group's committed offsets, asked until the coordinator has loaded them (a fresh
    broker answers COORDINATOR_LOAD_IN_PROGRESS meanwhile, and librdkafka's admin client
    does not retry it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    request = [ConsumerGroupTopicPartitions(group, wanted)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = admin.list_consumer_group_offsets(request)[group].result(15)
            return {tp.partition: tp.offset for tp in result.topic_partitions}
        except KafkaException as e:
            loading = e.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
            if not loading or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def consumed_keys(members: Iterable[Member]) -> Counter[Key]:
    return Counter((p, o) for m in members for p, o, _ in m.consumed())


def wait_consumed(members: list[Member], produced: dict[Key, bytes], running: list[Member]) -> None:
    """Wait until the members consumed every produced record (``running`` still consume)."""
    wait_until(
        lambda: consumed_keys(members).keys() >= produced.keys(),
        30,
        lambda: (
            f"{len(produced.keys() - consumed_keys(members).keys())} of "
            f"{len(produced)} records not consumed"
        ),
        running,
    )


def assert_consumed_exactly_once(
    members: list[Member], produced: dict[Key, bytes], bootstrap: str, group: str, topic: str
) -> None:
    """Every produced record consumed, with its value, once; no partition lost instead of
    revoked; the group's committed offsets at the end of the log."""
    consumed = consumed_keys(members)
    missing = produced.keys() - consumed.keys()
    assert not missing, f"{len(missing)} records never consumed, e.g. {sorted(missing)[:10]}"
    wrong = [(p, o, v) for m in members for p, o, v in m.consumed() if produced.get((p, o)) != v]
    assert not wrong, f"records read back with other values: {wrong[:10]}"
    assert [m.lost for m in members] == [0] * len(members), "partitions lost instead of revoked"
    repeated = {k: n for k, n in consumed.items() if n > 1}
    assert not repeated, (
        f"{len(repeated)} of {len(produced)} records consumed more than once, "
        f"e.g. {sorted(repeated.items())[:10]}"
    )
    ends = end_offsets(bootstrap, topic)
    assert ends == dict(Counter(p for p, _ in produced)), "the log's end is not what was acked"
    assert committed_offsets(bootstrap, group, topic) == ends


# --- tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def group_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker, with groups that react fast (``FAST_GROUPS``); the test that kills
    its broker starts its own."""
    with module_broker(tmp_path_factory, s3_server, **FAST_GROUPS) as b:
        yield b


@pytest.mark.parametrize("client", CLIENTS)
def test_three_members_split_six_partitions(group_broker: BrokerProcess, client: str) -> None:
    topic = group = f"split-{client}"
    create_topic(group_broker.bootstrap, topic)
    members = [new_member(client, group_broker, group, topic, f"{client}-{i}") for i in range(3)]
    with running(members):
        assignments = wait_settled(members, group_broker)
        assert sorted(map(len, assignments)) == [2, 2, 2], assignments
        # the broker's view is the clients'
        described = describe_group(group_broker.bootstrap, group)
        assert described.state == ConsumerGroupState.STABLE, described.state
        by_broker = sorted(
            sorted(tp.partition for tp in m.assignment.topic_partitions) for m in described.members
        )
        assert by_broker == sorted(sorted(a) for a in assignments)


@pytest.mark.parametrize("client", CLIENTS)
def test_rebalances_lose_and_repeat_no_record(group_broker: BrokerProcess, client: str) -> None:
    """Three members consume while records keep coming; one leaves midway, later another
    joins. Commits on revoke (and before closing) make every hand-over exact: each record is
    consumed once, and the committed offsets end at the end of the log."""
    bootstrap = group_broker.bootstrap
    topic = group = f"rebalance-{client}"
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, ((i % PARTITIONS, i) for i in range(600)))
    producer = SteadyProducer(bootstrap, topic, first=600)
    members = [new_member(client, group_broker, group, topic, f"{client}-{i}") for i in range(3)]
    with running(members):
        producer.start()
        try:
            wait_settled(members, group_broker)
            leaver = members[0]
            leaver.stop()
            wait_settled(members[1:], group_broker)
            joiner = new_member(client, group_broker, group, topic, f"{client}-3")
            members.append(joiner)
            joiner.start()
            wait_settled(members[1:], group_broker)
            time.sleep(1)  # the joiner consumes new records too
        finally:
            produced |= producer.stop()
        wait_consumed(members, produced, members[1:])
    assert leaver.consumed() and joiner.consumed(), "the rebalances did not happen midstream"
    assert_consumed_exactly_once(members, produced, bootstrap, group, topic)


@pytest.mark.parametrize("client", ["confluent-classic", "kafka-python", "aiokafka"])
def test_a_group_moves_to_the_consumer_protocol_and_back_as_its_members_switch(
    group_broker: BrokerProcess, client: str
) -> None:
    """KIP-848's online migration (``group.consumer.migration.policy``, bidirectional by
    default): two classic members consume; a member of the consumer protocol joins and the
    group becomes a consumer-protocol group, the classic members now assigned by the broker
    beside it; once it leaves, the group is a classic one again. Records keep coming
    meanwhile, and every one is consumed exactly once, with no partition lost."""
    bootstrap = group_broker.bootstrap
    topic = group = f"migrate-{client}"
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, ((i % PARTITIONS, i) for i in range(600)))
    producer = SteadyProducer(bootstrap, topic, first=600)
    members = [new_member(client, group_broker, group, topic, f"{client}-{i}") for i in range(2)]
    with running(members):
        producer.start()
        try:
            wait_settled(members, group_broker)
            assert describe_group(bootstrap, group).type == ConsumerGroupType.CLASSIC
            upgrader = new_member("confluent-consumer", group_broker, group, topic, "upgrader")
            members.append(upgrader)
            upgrader.start()
            assert sorted(map(len, wait_settled(members, group_broker))) == [2, 2, 2]
            described = describe_group(bootstrap, group)
            assert described.type == ConsumerGroupType.CONSUMER
            assert len(described.members) == 3
            upgrader.stop()
            assert sorted(map(len, wait_settled(members[:2], group_broker))) == [3, 3]
            described = describe_group(bootstrap, group)
            assert described.type == ConsumerGroupType.CLASSIC
            assert described.state == ConsumerGroupState.STABLE
            assert len(described.members) == 2
            time.sleep(1)  # the classic members consume new records again
        finally:
            produced |= producer.stop()
        wait_consumed(members, produced, members[:2])
    assert upgrader.consumed(), "the consumer-protocol member consumed nothing"
    assert_consumed_exactly_once(members, produced, bootstrap, group, topic)


def test_a_consumer_protocol_regex_is_matched_by_the_broker(group_broker: BrokerProcess) -> None:
    """librdkafka's KIP-848 consumer hands a ``^`` subscription to the broker as a regex
    (``SubscribedTopicRegex``): the broker matches topic names whole against it, takes in a
    topic created while the member runs, and leaves out the topics it does not match."""
    bootstrap = group_broker.bootstrap
    group = "regex-consumer"
    create_topic(bootstrap, "regex-orders")
    create_topic(bootstrap, "regex-orders-audit-unmatched")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )

    def assigned_until(wanted: set[str]) -> set[tuple[str, int]]:
        deadline = time.monotonic() + 30
        while True:
            consumer.poll(0.2)
            now = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            if {t for t, _ in now} == wanted or time.monotonic() > deadline:
                return now

    try:
        consumer.subscribe(["^regex-orders(-v[0-9]+)?"])
        first = assigned_until({"regex-orders"})
        assert first == {("regex-orders", p) for p in range(PARTITIONS)}
        create_topic(bootstrap, "regex-orders-v2")
        both = assigned_until({"regex-orders", "regex-orders-v2"})
        assert both == {(t, p) for t in ("regex-orders", "regex-orders-v2") for p in range(6)}
        described = describe_group(bootstrap, group)
        topics = {tp.topic for m in described.members for tp in m.assignment.topic_partitions}
        assert topics == {"regex-orders", "regex-orders-v2"}
    finally:
        consumer.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_static_member_restart_keeps_its_partitions_without_a_rebalance(
    group_broker: BrokerProcess, client: str
) -> None:
    """A static member closes without leaving (no LeaveGroup; a consumer-protocol member
    heartbeats epoch -2) and comes back with the same group.instance.id within the session
    timeout: it gets its partitions back and the other members see no rebalance."""
    topic = group = f"static-{client}"
    create_topic(group_broker.bootstrap, topic)
    members = [
        new_member(client, group_broker, group, topic, f"{client}-{i}", instance_id=f"instance-{i}")
        for i in range(3)
    ]
    with running(members):
        before = wait_settled(members, group_broker)
        others = members[1:]
        rebalances = [m.rebalances for m in others]
        members[0].stop()
        restarted = new_member(
            client, group_broker, group, topic, f"{client}-0-again", instance_id="instance-0"
        )
        members.append(restarted)
        restarted.start()
        wait_until(
            lambda: bool(restarted.assignment),
            20,
            lambda: f"the restarted member got no partitions\n{group_broker.log_tail()}",
            [restarted, *others],
        )
        assert restarted.assignment == before[0]
        # past the old member id's session timeout: a rebalance, whether for the rejoin or
        # for the old id expiring, would have reached the others by now
        time.sleep(SESSION_TIMEOUT_MS / 1000 + HEARTBEAT_INTERVAL_MS / 1000)
        for m in [restarted, *others]:
            m.check()
        assert [m.rebalances for m in others] == rebalances, (
            f"the other members saw rebalance callbacks\n{group_broker.log_tail()}"
        )
        assert [restarted.assignment, *(m.assignment for m in others)] == before
        described = describe_group(group_broker.bootstrap, group)
        assert described.state == ConsumerGroupState.STABLE, described.state
        assert sorted(str(m.group_instance_id) for m in described.members) == [
            "instance-0",
            "instance-1",
            "instance-2",
        ]


def test_committed_offsets_survive_kill_9(make_broker: MakeBroker) -> None:
    """A classic and a consumer-protocol group commit; after a kill -9 and a restart, new
    members of the same groups consume exactly the records after the committed offsets."""
    group_broker = make_broker(**FAST_GROUPS)
    bootstrap = group_broker.bootstrap
    topic = "resume"
    create_topic(bootstrap, topic)
    # a different count per partition, so offsets of one partition cannot pass for another's
    committed = {p: 20 + 7 * p for p in range(PARTITIONS)}
    first = produce(bootstrap, topic, [(p, i) for p, n in committed.items() for i in range(n)])
    groups = {"classic": "resume-classic", "consumer": "resume-consumer"}
    for protocol, group in groups.items():
        got = consume_in_group(group_broker, group, topic, protocol, len(first))
        assert got == first, f"{protocol}: the first member did not read the topic"
        assert committed_offsets(bootstrap, group, topic) == committed, protocol
    after = produce(bootstrap, topic, [(p, 1000 + i) for p in range(PARTITIONS) for i in range(9)])

    group_broker.kill()
    group_broker.start()

    for protocol, group in groups.items():
        assert committed_offsets(bootstrap, group, topic) == committed, protocol
        got = consume_in_group(group_broker, group, topic, protocol, len(after))
        assert sorted(got) == sorted(after), f"{protocol}: not resumed at the committed offsets"
        assert got == after


def consume_in_group(
    broker: BrokerProcess, group: str, topic: str, protocol: str, count: int
) -> dict[Key, bytes]:
    """Run a confluent-kafka member until it consumed ``count`` records, and a second more
    to catch any extra; it commits and leaves. What it consumed, by (partition, offset)."""
    member = ConfluentMember(f"{group}-member", broker.bootstrap, group, topic, protocol=protocol)
    with running([member]):
        wait_until(
            lambda: len(member.consumed()) >= count,
            30,
            lambda: f"{group}: {len(member.consumed())} of {count} records consumed",
            [member],
        )
        time.sleep(1)
    consumed = member.consumed()
    assert len(consumed) == len({(p, o) for p, o, _ in consumed}), f"{group}: repeated records"
    return {(p, o): v for p, o, v in consumed}
