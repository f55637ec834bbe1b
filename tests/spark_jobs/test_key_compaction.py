"""Key compaction end to end (``automq-py compact --kind key``): the real broker process, the
real S3 server, the job on PySpark or in-process, real clients checking what a compacted topic
holds afterwards: the last value of every key at its original offset, tombstones until
``delete.retention.ms``, no aborted transaction's data, ``min.compaction.lag.ms`` and
``max.compaction.lag.ms`` honoured, and the coordinators' topics (``__consumer_offsets``,
``__transaction_state``) bounded and read back after a restart."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq_py.coordinator import transaction_log
from automq_py.coordinator.transaction_log import TransactionLogValue
from automq_py.coordinator.transaction_metadata import TransactionState
from spark_jobs.controller_client import ControllerClient
from tests.automq_py.conftest import MakeBroker
from tests.spark_jobs.test_pipeline import run_job
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

# small segments so that a few thousand records make many sealed segments
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": str(16 << 10),
    "min.cleanable.dirty.ratio": "0.01",
}


def create(broker: BrokerProcess, configs: dict[str, str]) -> str:
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(15)
    return topic


def produce(
    broker: BrokerProcess,
    topic: str,
    updates: list[tuple[bytes, bytes | None]],
    timestamp_ms: int = 0,
) -> dict[bytes, tuple[int, bytes | None]]:
    """Produce ``updates`` in order (with this CreateTime, else now); each key's last
    (offset, value)."""
    last: dict[bytes, tuple[int, bytes | None]] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        last[msg.key()] = (msg.offset(), msg.value())  # type: ignore[attr-defined]

    # small batches, so that small segments roll often
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 4096})
    for key, value in updates:
        producer.produce(
            topic, value, key=key, partition=0, on_delivery=delivered, timestamp=timestamp_ms
        )
        producer.poll(0)
    producer.flush(30)
    return last


def read_all(
    broker: BrokerProcess, topic: str, isolation: str = "read_uncommitted"
) -> list[tuple[int, bytes, bytes | None]]:
    """Every record from offset 0 to the end (read_uncommitted: what compaction kept, aborted
    data included): (offset, key, value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                position = consumer.position([TopicPartition(topic, 0)])[0].offset
                if position >= end:
                    break
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), msg.key(), msg.value()))
            if msg.offset() >= end - 1:
                break
    finally:
        consumer.close()
    return out


def updates(keys: range, rounds: int, tag: str = "v") -> list[tuple[bytes, bytes | None]]:
    """``rounds`` updates of every key in ``keys``, ~100-byte values, round after round."""
    return [(f"k{k}".encode(), f"{tag}{r}-{k}-".encode() * 12) for r in range(rounds) for k in keys]


def active_base(broker: BrokerProcess, topic: str) -> int:
    """The base offset of the partition's active segment (what compaction never touches)."""

    async def go() -> int:
        async with await ControllerClient.connect(broker.bootstrap) as client:
            (log,), _ = await client.describe_log_segments([topic])
            return log.segments[-1].base_offset

    return asyncio.run(go())


def test_only_the_last_value_of_each_key_is_left(make_broker: MakeBroker) -> None:
    broker = make_broker()
    topic = create(broker, COMPACTED)
    last = produce(broker, topic, updates(range(100), 60))  # 6,000 updates over 100 keys
    assert len(read_all(broker, topic)) == 6000
    output = run_job(broker, "compact", "--kind", "key")  # on Spark (local[2])
    assert f"{topic}-0: clean [0, " in output
    after = read_all(broker, topic)
    survivors = {key: (offset, value) for offset, key, value in after}
    # every key's last value, at the offset it was written at
    assert {k: survivors[k] for k in last} == last
    # below the active segment at most one record per key is left
    base = active_base(broker, topic)
    assert base > 0
    below = [key for offset, key, _ in after if offset < base]
    assert len(below) == len(set(below)) <= 100
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(offsets)
    # the active segment is left as it was
    assert len(after) - len(below) == 6000 - base < 1000


def cleaned(output: str, topic: str) -> bool:
    """Whether the job's output says it cleaned ``topic``'s partition."""
    return f"{topic}-0: clean [" in output


def test_min_compaction_lag_keeps_recent_records_uncompacted(make_broker: MakeBroker) -> None:
    broker = make_broker()
    waiting = create(broker, {**COMPACTED, "min.compaction.lag.ms": str(3_600_000)})
    eager = create(broker, {**COMPACTED, "min.compaction.lag.ms": "0"})
    for topic in (waiting, eager):
        produce(broker, topic, updates(range(50), 20))  # 1,000 updates of 50 keys, just now
    output = run_job(broker, "compact", "--kind", "key", "--runner", "local")
    # every record is newer than an hour: no segment of it is cleanable yet
    assert not cleaned(output, waiting) and len(read_all(broker, waiting)) == 1000
    assert cleaned(output, eager) and len(read_all(broker, eager)) < 1000


def test_max_compaction_lag_cleans_below_the_dirty_ratio(make_broker: MakeBroker) -> None:
    """``max.compaction.lag.ms`` cleans a log whose dirty share is under
    ``min.cleanable.dirty.ratio`` once its oldest dirty record is older than the lag (records
    written with an hour-old CreateTime, so no test waits)."""
    broker = make_broker()
    lazy = {**COMPACTED, "min.cleanable.dirty.ratio": "0.99"}
    bounded = create(broker, {**lazy, "max.compaction.lag.ms": "60000"})
    unbounded = create(broker, lazy)
    for topic in (bounded, unbounded):
        produce(broker, topic, updates(range(100), 20))
    first = run_job(broker, "compact", "--kind", "key", "--runner", "local")
    assert cleaned(first, bounded) and cleaned(first, unbounded)  # all dirty: 100% >= 99%
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    for topic in (bounded, unbounded):
        produce(broker, topic, updates(range(100), 3, tag="w"), timestamp_ms=an_hour_ago)
    second = run_job(broker, "compact", "--kind", "key", "--runner", "local")
    # the cleaned segment now holds a share of the range: the dirty ratio is below 99%
    assert not cleaned(second, unbounded)
    assert cleaned(second, bounded) and "max.compaction.lag.ms passed" in second
    for topic, left_dirty in ((bounded, False), (unbounded, True)):
        base = active_base(broker, topic)
        below = [key for offset, key, _ in read_all(broker, topic) if offset < base]
        assert (len(below) > len(set(below))) is left_dirty, topic


def test_tombstones_stay_until_delete_retention_then_go(make_broker: MakeBroker) -> None:
    broker = make_broker()
    topic = create(broker, {**COMPACTED, "delete.retention.ms": "2000"})
    history = updates(range(20), 30)
    history += [(f"k{k}".encode(), None) for k in range(5)]  # delete keys 0-4
    history += updates(range(5, 20), 20, tag="w")  # the tombstones end up in sealed segments
    produce(broker, topic, history)
    run_job(broker, "compact", "--kind", "key", "--runner", "local")
    first = {k: v for _, k, v in read_all(broker, topic)}
    assert [first.get(f"k{k}".encode(), b"gone") for k in range(5)] == [None] * 5
    time.sleep(2.5)  # past the tombstones' delete horizon
    produce(broker, topic, updates(range(5, 20), 30, tag="x"))  # new dirty segments
    run_job(broker, "compact", "--kind", "key", "--runner", "local")
    second = {k: v for _, k, v in read_all(broker, topic)}
    assert [f"k{k}".encode() in second for k in range(5)] == [False] * 5
    assert all(second[f"k{k}".encode()] is not None for k in range(5, 20))


def test_compaction_drops_aborted_transactions(make_broker: MakeBroker) -> None:
    broker = make_broker()
    topic = create(broker, COMPACTED)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx"})
    producer.init_transactions(30)
    for i in range(20):
        producer.begin_transaction()
        aborted = i % 4 == 3
        for k in range(10):
            # an aborted transaction's keys are never written again: only the abort can drop them
            key = f"a{i}-{k}" if aborted else f"k{k}"
            producer.produce(topic, f"t{i}-{k}-".encode() * 20, key=key.encode(), partition=0)
        producer.flush(30)
        if aborted:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    produce(broker, topic, updates(range(10, 20), 20, tag="plain"))  # seal them
    uncommitted_before = {k for _, k, _ in read_all(broker, topic)}
    assert b"a3-0" in uncommitted_before  # read_uncommitted sees aborted data until compacted
    run_job(broker, "compact", "--kind", "key", "--runner", "local")
    after = {k: v for _, k, v in read_all(broker, topic)}
    assert not [k for k in after if k.startswith(b"a")]
    # the committed transactions' last values stay, for read_committed consumers too (the
    # cleaned segment's transaction index lists only aborts whose markers it kept)
    assert [after[f"k{k}".encode()][:4] for k in range(10)] == [b"t18-"] * 10
    committed = {k: v for _, k, v in read_all(broker, topic, "read_committed")}
    assert committed == after


def test_the_offsets_topic_stays_bounded_under_steady_commits(make_broker: MakeBroker) -> None:
    broker = make_broker(
        **{
            "offsets.topic.num.partitions": "1",
            "offsets.topic.segment.bytes": str(16 << 10),
        }
    )
    topic = create(broker, {})
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "steady", "enable.auto.commit": False}
    )
    for i in range(2000):  # 2,000 commits of one offset each
        consumer.commit(offsets=[TopicPartition(topic, 0, i + 1)], asynchronous=False)
    consumer.close()
    offsets_topic = "__consumer_offsets"
    before = read_all(broker, offsets_topic)
    assert len(before) >= 2000
    run_job(broker, "compact", "--kind", "key", "--runner", "local")
    after = read_all(broker, offsets_topic)
    base = active_base(broker, offsets_topic)
    below = [key for offset, key, _ in after if offset < base]
    assert base > 0 and len(below) == len(set(below)) <= 2  # the offset key (and the group's)
    assert len(after) < len(before) // 4
    # the group coordinator reads the cleaned log back after a restart
    assert broker.stop() == 0
    broker.start()
    again = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "steady", "enable.auto.commit": False}
    )
    (committed,) = again.committed([TopicPartition(topic, 0)], timeout=30)
    again.close()
    assert committed.offset == 2000


def test_the_transaction_log_stays_bounded_under_steady_transactions(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker(
        **{
            "transaction.state.log.num.partitions": "1",
            "transaction.state.log.segment.bytes": str(16 << 10),
        }
    )
    topic = create(broker, {})
    ids = [f"steady-{i}" for i in range(3)]

    def transactional(txn_id: str) -> Producer:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(30)
        return producer

    def one_transaction(producer: Producer, txn_id: str, n: int) -> None:
        producer.begin_transaction()
        producer.produce(topic, f"{txn_id}-{n}".encode(), key=txn_id.encode(), partition=0)
        producer.commit_transaction(30)

    # one more id leaves a transaction open throughout: its Ongoing record ends up cleaned
    hanging = transactional("hanging")
    hanging.begin_transaction()
    hanging.produce(topic, b"never committed", key=b"hanging", partition=0)
    hanging.flush(30)
    producers = {txn_id: transactional(txn_id) for txn_id in ids}
    for n in range(150):  # 450 transactions, each a few state changes of its id's record
        for txn_id, producer in producers.items():
            one_transaction(producer, txn_id, n)
    del producers, hanging
    state_topic = "__transaction_state"
    completed(broker, ids)
    before = read_all(broker, state_topic)
    assert len(before) >= 3 * 450
    run_job(broker, "compact", "--kind", "key", "--runner", "local")
    after = read_all(broker, state_topic)
    base = active_base(broker, state_topic)
    below = [key for offset, key, _ in after if offset < base]
    assert base > 0 and len(below) == len(set(below)) <= len(ids) + 1  # one record per id
    assert len(after) < len(before) // 4
    kept = states(after)
    assert {i: s.status for i, s in kept.items()} == {
        **{txn_id: TransactionState.COMPLETE_COMMIT for txn_id in ids},
        "hanging": TransactionState.ONGOING,
    }
    # the transaction coordinator reads the cleaned log back after a restart: each id goes on
    # with its producer id (a new epoch) and its next transaction commits; the open one is
    # aborted when its id is initialised again (the epoch fenced, then bumped once more)
    assert broker.stop() == 0
    broker.start()
    for txn_id in [*ids, "hanging"]:
        producer = transactional(txn_id)
        one_transaction(producer, txn_id, 150)
        producer.flush(30)
    again = completed(broker, [*ids, "hanging"])
    for txn_id in ids:
        assert again[txn_id].producer_id == kept[txn_id].producer_id
        assert again[txn_id].producer_epoch == kept[txn_id].producer_epoch + 1
    assert again["hanging"].producer_id == kept["hanging"].producer_id
    assert again["hanging"].producer_epoch == kept["hanging"].producer_epoch + 2
    committed = read_all(broker, topic, "read_committed")
    last = {key: value for _, key, value in committed}
    assert last == {txn_id.encode(): f"{txn_id}-150".encode() for txn_id in [*ids, "hanging"]}
    assert len(committed) == 3 * 151 + 1


def completed(broker: BrokerProcess, ids: list[str]) -> dict[str, TransactionLogValue]:
    """The ids' states once each last transaction is CompleteCommit (EndTxn answers once
    PrepareCommit is durable; the coordinator writes CompleteCommit after the markers)."""
    deadline = time.monotonic() + 30
    while True:
        found = states(read_all(broker, "__transaction_state"))
        done = {i: s for i, s in found.items() if s.status == TransactionState.COMPLETE_COMMIT}
        if set(done) >= set(ids):
            return {i: done[i] for i in ids}
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def states(records: list[tuple[int, bytes, bytes | None]]) -> dict[str, TransactionLogValue]:
    """Each transactional id's last state in ``__transaction_state`` records."""
    out: dict[str, TransactionLogValue] = {}
    for _, key, value in records:
        k, v = transaction_log.decode_key(key), transaction_log.decode_value(value)
        if k is not None and v is not None:
            out[k.transactional_id] = v
    return out
