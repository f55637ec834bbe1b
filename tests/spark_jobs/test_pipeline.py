"""The maintenance pipeline end to end: the real broker process, the real S3 server and real
PySpark (``automq-py compact|retention|gc --runner spark``), with real clients checking data."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_jobs.controller_client import ControllerClient
from spark_jobs.jobs import FAULT_ENV, PAUSE_BEFORE_COMMIT
from storage.compaction.units import ListUnit, StoreSpec, list_keys
from storage.metadata.image import MetadataImage
from storage.metadata.model import ObjectState
from storage.object_format import object_key
from storage.operator.base import ObjectInfo
from tests.automq_py.conftest import MakeBroker
from tests.support.broker import REPO, BrokerProcess

pytestmark = pytest.mark.integration

Record = tuple[int, int, bytes, bytes]  # partition, offset, key, value
SMALL_UPLOADS = {"s3.wal.upload.interval.ms": "200", "s3.maintenance.runner": "none"}


def job_command(broker: BrokerProcess, *args: str, **overrides: str) -> list[str]:
    """``automq-py <args>`` with the broker's own configuration (plus ``overrides``), through
    Spark unless ``args`` name a runner."""
    command = [sys.executable, "-m", "automq_py", *args, "--bootstrap-server", broker.bootstrap]
    if "--runner" not in args:
        command += ["--runner", "spark", "--master", "local[2]"]
    for key, value in {**broker.overrides, **overrides}.items():
        command += ["--override", f"{key}={value}"]
    return command


def run_job(broker: BrokerProcess, *args: str, timeout: float = 300) -> str:
    command = job_command(broker, *args)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def spec_of(broker: BrokerProcess) -> StoreSpec:
    return StoreSpec(
        url=broker.overrides["s3.data.buckets"],
        namespace=f"_kafka_{broker.overrides['cluster.id']}",
    )


def bucket(broker: BrokerProcess) -> list[ObjectInfo]:
    return list_keys(ListUnit(spec_of(broker), ("",)))


def describe(broker: BrokerProcess) -> MetadataImage:
    async def go() -> MetadataImage:
        async with await ControllerClient.connect(broker.bootstrap) as client:
            return (await client.describe_s3_metadata())[0]

    return asyncio.run(go())


def settled(broker: BrokerProcess, bucket_bytes: int = 0) -> MetadataImage:
    """The metadata once the broker has uploaded what its WAL held: nothing new committed for a
    second (five upload intervals), so what changes next is the job's doing; and at least
    ``bucket_bytes`` in the bucket (on a busy machine an upload can start later than that)."""
    image = describe(broker)
    deadline = time.monotonic() + 60
    while True:
        time.sleep(1.0)
        again = describe(broker)
        if again == image and sum(i.size for i in bucket(broker)) >= bucket_bytes:
            return image
        assert time.monotonic() < deadline, "the broker never stopped uploading"
        image = again


def live_objects(image: MetadataImage) -> int:
    return sum(1 for o in image.objects.values() if o.state is ObjectState.COMMITTED)


def metadata_rows(image: MetadataImage) -> int:
    """Rows of the objects, SSO, SSO range and SO tables this image stands for."""
    ssos = [sso for node in image.nodes.values() for sso in node.stream_set_objects]
    sos = sum(len(s.stream_objects) for s in image.streams.values())
    return len(image.objects) + len(ssos) + sum(len(s.ranges) for s in ssos) + sos


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    futures[name].result(30)


def produce(
    bootstrap: str,
    topic: str,
    rounds: int,
    partitions: int,
    per_partition: int,
    size: int,
    pause: float,
    timestamp_ms: int = 0,
) -> list[Record]:
    """``rounds`` rounds of records to every partition, ``pause`` apart (one upload each);
    ``timestamp_ms`` sets their CreateTime (0: now)."""
    out: list[Record] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

    for r in range(rounds):
        for p in range(partitions):
            for i in range(per_partition):
                key = f"{p}-{r}-{i}".encode()
                producer.produce(
                    topic,
                    os.urandom(size),
                    key,
                    partition=p,
                    on_delivery=delivered,
                    timestamp=timestamp_ms,
                )
        producer.flush(30)
        time.sleep(pause)
    assert producer.flush(30) == 0
    return out


def consume_all(
    bootstrap: str, topic: str, partitions: int, ends: dict[int, int], start: int = -2
) -> list[Record]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "check",
            "enable.auto.commit": False,
            "fetch.max.bytes": 4 << 20,
        }
    )
    consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
    out: list[Record] = []
    seen = dict.fromkeys(range(partitions), -1)
    deadline = time.monotonic() + 120
    try:
        while any(seen[p] + 1 < ends.get(p, 0) for p in range(partitions)):
            assert time.monotonic() < deadline, f"consumed {len(out)}"
            for m in consumer.consume(1000, 1.0):
                assert m.error() is None, m.error()
                out.append((m.partition(), m.offset(), m.key(), m.value()))
                seen[m.partition()] = m.offset()
    finally:
        consumer.close()
    return out


def low_watermark(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lw"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)[0]
    finally:
        consumer.close()


@pytest.fixture
def pipeline_broker(make_broker: MakeBroker) -> Iterator[BrokerProcess]:
    yield make_broker(
        **SMALL_UPLOADS,
        **{
            "s3.object.delete.retention.minutes": "0",
            "s3.object.gc.orphan.min.age.minutes": "0",
        },
    )


def test_compaction_of_200_partitions_cuts_objects_and_keeps_every_record(
    pipeline_broker: BrokerProcess,
) -> None:
    broker = pipeline_broker
    create_topic(broker.bootstrap, "many", 200)
    produced = produce(
        broker.bootstrap, "many", rounds=36, partitions=200, per_partition=3, size=300, pause=0.3
    )
    ends = {p: 1 + max(o for q, o, _, _ in produced if q == p) for p in range(200)}
    before = settled(broker)
    keys_before = len(bucket(broker))

    # the dry run and GC on this process's threads: the SSO compaction is what runs on Spark
    # here (GC on Spark is the killed job's test), and each Spark job costs a JVM start
    dry = run_job(broker, "compact", "--kind", "sso", "--dry-run", "--runner", "local")
    assert "compact" in dry and describe(broker) == before  # a dry run changes nothing
    run_job(broker, "compact", "--kind", "sso")
    run_job(broker, "gc", "--runner", "local")
    after = describe(broker)
    keys_after = len(bucket(broker))

    print(
        f"\nobjects {live_objects(before)} -> {live_objects(after)}, bucket keys {keys_before}"
        f" -> {keys_after}, metadata rows {metadata_rows(before)} -> {metadata_rows(after)}"
    )
    assert live_objects(before) >= 10 * live_objects(after)
    assert keys_before >= 10 * keys_after
    assert metadata_rows(before) >= 10 * metadata_rows(after)

    broker.stop()  # a restart empties every cache: what follows reads object storage
    broker.start()
    consumed = consume_all(broker.bootstrap, "many", 200, ends)
    assert sorted(consumed) == sorted(produced)  # byte-identical, offsets unchanged


def test_killed_job_loses_nothing_and_gc_removes_its_objects(
    pipeline_broker: BrokerProcess,
) -> None:
    broker = pipeline_broker
    create_topic(broker.bootstrap, "kill", 8)
    produced = produce(
        broker.bootstrap, "kill", rounds=12, partitions=8, per_partition=20, size=2000, pause=0.3
    )
    ends = {p: 1 + max(o for q, o, _, _ in produced if q == p) for p in range(8)}
    before = settled(broker)
    first_new = before.next_id("object_id")
    spec = spec_of(broker)

    command = job_command(
        broker,
        "compact",
        "--kind",
        "sso",
        **{
            "s3.stream.set.object.compaction.cache.size": str(64 << 10),
            "s3.stream.set.object.compaction.stream.split.size": str(32 << 10),
            "s3.object.prepare.ttl.ms": "2000",
        },
    )
    scratch = broker.data_dir.parent / "job-tmp"  # what the killed JVM leaves: pytest's to remove
    scratch.mkdir()
    printed = scratch / "job.out"
    with printed.open("w") as stdout:
        job = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, "TMPDIR": str(scratch), FAULT_ENV: PAUSE_BEFORE_COMMIT},
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        # the job holds between writing its objects and committing them: kill it there
        deadline = time.monotonic() + 180
        while f"fault point {PAUSE_BEFORE_COMMIT}" not in printed.read_text():
            assert job.poll() is None, "the job ended without reaching its commit:\n" + (
                printed.read_text()
            )
            assert time.monotonic() < deadline, printed.read_text()
            time.sleep(0.1)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the driver, Spark's JVM and its Python workers
        job.wait()
    after = describe(broker)
    committed = {i for i, o in after.objects.items() if o.state is ObjectState.COMMITTED}
    written = [
        i.key for i in bucket(broker) if _id(i, spec) >= first_new and _id(i, spec) not in committed
    ]
    assert written, "the job wrote nothing before it was killed"
    old = {sso.object_id for n in before.nodes.values() for sso in n.stream_set_objects}
    kept = {sso.object_id for n in after.nodes.values() for sso in n.stream_set_objects}
    assert old <= kept  # nothing was committed: every source is still there

    stray = object_key(spec.namespace, 10**9)  # an orphan nothing names

    async def put_stray() -> None:
        store = spec.open()
        try:
            await store.put(stray, b"junk")
        finally:
            await store.close()

    asyncio.run(put_stray())
    time.sleep(2.5)  # the job's prepared objects expire
    out = run_job(broker, "gc")
    assert "orphan" in out
    left = {i.key for i in bucket(broker)}
    assert stray not in left and not left & set(written)
    assert sorted(consume_all(broker.bootstrap, "kill", 8, ends)) == sorted(produced)


def _id(info: ObjectInfo, spec: StoreSpec) -> int:
    return int(info.key.rsplit("/", 1)[1]) if f"/{spec.namespace}/" in info.key else -1


def test_retention_by_time_and_by_size(pipeline_broker: BrokerProcess) -> None:
    broker = pipeline_broker
    # the old records carry timestamps an hour back: retention.ms of a minute expires them and
    # not the new ones, however long the job takes to start on a busy machine
    create_topic(broker.bootstrap, "timed", 1, **{"retention.ms": "60000", "segment.ms": "500"})
    create_topic(
        broker.bootstrap,
        "sized",
        1,
        **{"retention.bytes": "50000", "segment.bytes": "20000", "retention.ms": "-1"},
    )
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    old = produce(
        broker.bootstrap,
        "timed",
        rounds=1,
        partitions=1,
        per_partition=300,
        size=3000,
        pause=0,
        timestamp_ms=an_hour_ago,
    )
    sized = produce(
        broker.bootstrap, "sized", rounds=20, partitions=1, per_partition=10, size=1000, pause=0
    )
    new = produce(
        broker.bootstrap, "timed", rounds=1, partitions=1, per_partition=50, size=3000, pause=0.5
    )
    settled(broker, bucket_bytes=1_250_000)  # everything produced (1.25 MB) is in the bucket
    bytes_before = sum(i.size for i in bucket(broker))

    out = run_job(broker, "retention")
    assert "timed-0" in out and "sized-0" in out

    assert low_watermark(broker.bootstrap, "timed", 0) == 300  # the old records are gone
    got = consume_all(broker.bootstrap, "timed", 1, {0: 350})
    assert sorted(got) == sorted(new)  # the new ones stay
    start = low_watermark(broker.bootstrap, "sized", 0)
    assert 0 < start <= 150  # at least retention.bytes (~50 records of 1 KB) kept
    assert sorted(consume_all(broker.bootstrap, "sized", 1, {0: 200})) == sorted(
        r for r in sized if r[1] >= start
    )
    # retention is what runs on Spark here; compaction and GC have their own Spark tests
    run_job(broker, "compact", "--runner", "local")  # trimmed data is dropped from the objects
    run_job(broker, "gc", "--runner", "local")  # and what held it leaves the bucket
    bytes_after = sum(i.size for i in bucket(broker))
    print(f"\nbucket bytes {bytes_before} -> {bytes_after}")
    assert bytes_after < bytes_before - 800_000  # the 900 KB of old records left the bucket
    assert old  # produced, then expired


def test_broker_keeps_its_bucket_bounded_by_itself(make_broker: MakeBroker) -> None:
    """Short intervals, a small retention, steady produce: the object count and the bucket's
    size level off instead of growing with the data written. The shorter the intervals and the
    smaller each partition's batches, the lower the level and the sooner it shows against what
    was written: 35 s of produce, where a busy two-core machine holds some 10 s of it."""
    broker = make_broker(
        **{
            "s3.wal.upload.interval.ms": "200",
            "s3.maintenance.runner": "local",
            "s3.stream.set.object.compaction.interval.minutes": "0.01",
            "s3.stream.object.compaction.interval.minutes": "0.02",
            "log.retention.check.interval.ms": "500",
            "s3.object.delete.retention.minutes": "0",
            "log.retention.ms": "1000",
            "log.roll.ms": "500",
        }
    )
    create_topic(broker.bootstrap, "steady", 10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    samples: list[tuple[float, int, int]] = []
    written = 0
    started = time.monotonic()
    while time.monotonic() - started < 35:
        # spread over the partitions (not one 100 KB batch to one partition at a time): each
        # partition's oldest segment is due for retention a second after it was written
        for i in range(100):
            producer.produce("steady", os.urandom(1000), partition=i % 10)
            written += 1000
        producer.flush(30)
        time.sleep(0.25)
        if not samples or time.monotonic() - samples[-1][0] - started >= 2.5:
            keys = bucket(broker)
            samples.append((time.monotonic() - started, len(keys), sum(i.size for i in keys)))
            print(
                f"t={samples[-1][0]:5.1f}s objects={samples[-1][1]:4d} "
                f"bytes={samples[-1][2]:9d} written={written}"
            )
    assert "maintenance compact-sso done" in broker.log_path.read_text()
    late = samples[len(samples) * 2 // 3 :]
    assert max(n for _, n, _ in late) <= 40
    # 1 s retained, plus the delays of rolls, checks, compaction and GC (a few seconds of data
    # each): far below the 35 s written. Compaction that kept whole blocks holding a stream's
    # start held on to most of what was written (58-88% measured here).
    # (a single sample can catch a compaction's output beside its sources: the median is the
    # level, the max only has to stay well below what was written)
    sizes = sorted(b for _, _, b in late)
    assert sizes[len(sizes) // 2] <= written // 2 and sizes[-1] <= written * 7 // 10


def test_broker_compacts_through_spark_children_by_itself(make_broker: MakeBroker) -> None:
    """``s3.maintenance.runner=spark``: the broker runs ``automq-py compact --runner spark`` as
    a child process on its interval; the small objects become one and every record reads back
    from object storage, while retention and GC run in-process."""
    broker = make_broker(**SMALL_UPLOADS)
    create_topic(broker.bootstrap, "tended", 8)
    produced = produce(
        broker.bootstrap, "tended", rounds=25, partitions=8, per_partition=10, size=500, pause=0.3
    )
    ends = {p: 1 + max(o for q, o, _, _ in produced if q == p) for p in range(8)}
    objects_before = live_objects(settled(broker))
    assert objects_before >= 10
    # the same broker, restarted with its maintenance on: the first compaction comes 6 s after
    # the start (retention first, every 2 s), with every object already uploaded, instead of
    # an interval chosen to outlast the produce; the next one 6 s after the first ends, when
    # this test has stopped the broker
    broker.stop()
    broker.overrides |= {
        "s3.maintenance.runner": "spark",
        "s3.stream.set.object.compaction.interval.minutes": "0.1",
        "log.retention.check.interval.ms": "2000",
    }
    broker.start()
    deadline = time.monotonic() + 180
    while "maintenance compact-sso: " not in broker.log_path.read_text():
        assert time.monotonic() < deadline, broker.log_tail()
        time.sleep(1)
    log_text = broker.log_path.read_text()
    assert "compaction on spark" in log_text and "maintenance retention done" in log_text
    objects_after = live_objects(describe(broker))
    print(f"\nobjects {objects_before} -> {objects_after} (Spark child of the broker)")
    assert objects_after * 5 <= objects_before
    broker.stop()
    broker.start()
    assert sorted(consume_all(broker.bootstrap, "tended", 8, ends)) == sorted(produced)


def test_stream_objects_of_a_stream_merge(pipeline_broker: BrokerProcess) -> None:
    """SSO compaction with a small split size makes a Stream Object per partition per run;
    ``compact --kind so`` merges each partition's into one, and every record reads back from
    object storage after a restart. The SSO compactions that set this up run on this process's
    threads (SSO compaction on Spark is the 200 partitions' test); the merge runs on Spark."""
    broker = pipeline_broker
    create_topic(broker.bootstrap, "split", 2)
    produced: list[Record] = []
    for _ in range(3):  # three compaction runs: three Stream Objects per partition's log
        produced += produce(
            broker.bootstrap,
            "split",
            rounds=4,
            partitions=2,
            per_partition=20,
            size=1000,
            pause=0.3,
        )
        settled(broker)
        command = job_command(
            broker,
            "compact",
            "--kind",
            "sso",
            "--runner",
            "local",
            **{"s3.stream.set.object.compaction.stream.split.size": str(16 << 10)},
        )
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    ends = {p: 1 + max(o for q, o, _, _ in produced if q == p) for p in range(2)}

    def stream_objects() -> list[int]:
        return sorted(len(s.stream_objects) for s in describe(broker).streams.values())

    before = stream_objects()
    assert before[-2:] == [3, 3]  # the two partitions' Log streams
    out = run_job(broker, "compact", "--kind", "so")
    after = stream_objects()
    print(f"\nstream objects per stream {before} -> {after}: {out.strip().splitlines()[-1]}")
    assert after[-2:] == [1, 1]
    broker.stop()
    broker.start()
    assert sorted(consume_all(broker.bootstrap, "split", 2, ends)) == sorted(produced)
