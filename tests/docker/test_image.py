"""The container image (docker/Dockerfile) under podman: through testcontainers as users run
it, startup and SIGTERM timings with nothing lost, and a kill -9 mid-produce on a volume."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq_py.health import check
from tests.support.broker import free_port
from tests.support.podman import Podman

pytestmark = pytest.mark.integration

Record = tuple[int, int, bytes]  # partition, offset, value


def produce(bootstrap: str, topic: str, count: int) -> list[Record]:
    acked: list[Record] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

    for i in range(count):
        producer.produce(topic, f"{topic}-{i}".encode(), partition=i % 3, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    return acked


def consume(bootstrap: str, topic: str, ends: dict[int, int]) -> list[Record]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    out: list[Record] = []
    next_offset = dict.fromkeys(ends, 0)
    deadline = time.monotonic() + 60
    try:
        while any(next_offset[p] < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"consumed {len(out)}, up to {next_offset}"
            for m in consumer.consume(500, 1.0):
                assert m.error() is None, m.error()
                out.append((m.partition(), m.offset(), m.value()))
                next_offset[m.partition()] = m.offset() + 1
    finally:
        consumer.close()
    return out


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)


def ends_of(records: list[Record]) -> dict[int, int]:
    return {p: 1 + max(o for q, o, _ in records if q == p) for p in {r[0] for r in records}}


def wait_serving(bootstrap: str, timeout: float = 30) -> float:
    """Seconds until the broker answers ApiVersions."""
    started = time.monotonic()
    host, port = bootstrap.rsplit(":", 1)
    while check(host, int(port), 1.0) is not None:
        assert time.monotonic() - started < timeout, f"{bootstrap} is not serving"
        time.sleep(0.02)
    return time.monotonic() - started


def test_testcontainers_container_serves_confluent_kafka(
    docker_api: None, automq_image: str
) -> None:
    from automq_py.testing.container import AutoMQContainer

    with AutoMQContainer(automq_image).with_property("num.partitions", "3") as broker:
        bootstrap = broker.get_bootstrap_server()
        assert not bootstrap.endswith(":9092")  # the engine's mapped port, advertised
        acked = produce(bootstrap, "through-testcontainers", 3000)  # auto-created, 3 partitions
        assert {p for p, _, _ in acked} == {0, 1, 2}
        got = consume(bootstrap, "through-testcontainers", ends_of(acked))
        assert sorted(got) == sorted(acked)


@pytest.fixture
def container(podman: Podman, automq_image: str) -> Iterator[tuple[str, str, str]]:
    """A created (not started) container on a fresh volume: its name, image and bootstrap."""
    name = f"automq-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    podman.run("volume", "create", name)
    podman.run(
        "create",
        "--name",
        name,
        "--publish",
        f"127.0.0.1:{port}:9092",
        "--volume",
        f"{name}:/var/lib/automq",
        "--env",
        f"KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://127.0.0.1:{port}",
        automq_image,
    )
    try:
        yield name, automq_image, f"127.0.0.1:{port}"
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)
        podman.run("volume", "rm", "--force", name, check=False)


def test_image_starts_fast_stops_on_sigterm_fast_and_keeps_everything(
    podman: Podman, container: tuple[str, str, str]
) -> None:
    name, _, bootstrap = container
    started = time.monotonic()
    podman.run("start", name)
    wait_serving(bootstrap)
    start_s = time.monotonic() - started
    assert podman.run("exec", name, "id", "-u").strip() != "0"  # not root
    podman.run("healthcheck", "run", name)  # the image's HEALTHCHECK passes
    create_topic(bootstrap, "kept")
    acked = produce(bootstrap, "kept", 5000)

    stopping = time.monotonic()
    podman.run("stop", "--time", "10", name)  # SIGTERM, SIGKILL after 10 s
    stop_s = time.monotonic() - stopping
    exit_code = podman.run("inspect", name, "--format", "{{.State.ExitCode}}").strip()
    print(f"\nimage: start to serving {start_s:.2f} s, SIGTERM to exit {stop_s:.2f} s")
    assert exit_code == "0"  # a graceful stop, not the kill after the timeout
    assert start_s < 5 and stop_s < 2

    podman.run("start", name)
    wait_serving(bootstrap)
    assert sorted(consume(bootstrap, "kept", ends_of(acked))) == sorted(acked)


def test_kill_mid_produce_and_restart_on_the_volume_loses_nothing_acknowledged(
    podman: Podman, container: tuple[str, str, str]
) -> None:
    name, _, bootstrap = container
    podman.run("start", name)
    wait_serving(bootstrap)
    create_topic(bootstrap, "killed")
    acked: list[Record] = []
    stop = threading.Event()

    def keep_producing() -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 5000,
            }
        )

        def delivered(err: object, msg: object) -> None:
            if err is None:
                acked.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

        i = 0
        while not stop.is_set():
            producer.produce("killed", f"v{i}".encode(), partition=i % 3, on_delivery=delivered)
            producer.poll(0.0005 if i % 50 else 0.01)
            i += 1
        producer.flush(10)

    producing = threading.Thread(target=keep_producing)
    producing.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 2000:
            assert time.monotonic() < deadline, f"only {len(acked)} acknowledged"
            time.sleep(0.05)
        podman.run("kill", "--signal", "KILL", name)
    finally:
        stop.set()
        producing.join(60)
    print(f"\n{len(acked)} records acknowledged before the kill")
    podman.run("start", name)
    wait_serving(bootstrap)
    got = set(consume(bootstrap, "killed", ends_of(acked)))
    missing = [r for r in acked if r not in got]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
