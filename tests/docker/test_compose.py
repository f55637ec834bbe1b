"""docker/compose.yml under podman-compose: the broker on SeaweedFS in one ``up``, reached from
the host, and everything gone after ``down -v``; the ``cluster`` profile's three brokers over
PostgreSQL serving one topic through any of them; the ``monitoring`` profile's Prometheus
scraping the broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from automq_py.testing.cluster import listed_brokers
from tests.docker.test_image import consume, create_topic, ends_of, produce, wait_serving
from tests.support.broker import REPO, free_port
from tests.support.podman import BASE_IMAGE, IMAGE, Podman

pytestmark = pytest.mark.integration

COMPOSE = REPO / "docker" / "compose.yml"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"
# no registry here: a stand-in for the official postgres image (tests/docker/postgres.Dockerfile)
POSTGRES_IMAGE = "localhost/automq-py-test-postgres:15"
PROMETHEUS_IMAGE = "localhost/automq-py-prometheus:latest"

Compose = Callable[..., str]


@pytest.fixture(scope="module")
def compose_images(podman: Podman, automq_image: str) -> None:
    """The images compose.yml names, built here (no registry, the local base, the CA secret)."""
    podman.run("tag", IMAGE, "localhost/automq-py:latest")
    podman.build_image("docker/seaweedfs.Dockerfile", "localhost/automq-py-seaweedfs:latest")


@pytest.fixture(scope="module")
def postgres_image(podman: Podman, compose_images: None) -> str:
    podman.run(
        "build",
        "--format",
        "docker",
        "--quiet",
        "--file",
        str(REPO / "tests" / "docker" / "postgres.Dockerfile"),
        "--build-arg",
        f"BASE={BASE_IMAGE}",
        "--tag",
        POSTGRES_IMAGE,
        str(REPO / "tests" / "docker"),
        timeout=1200,
    )
    return POSTGRES_IMAGE


@pytest.fixture(scope="module")
def prometheus_image(podman: Podman, compose_images: None) -> str:
    podman.build_image("docker/prometheus.Dockerfile", PROMETHEUS_IMAGE)
    return PROMETHEUS_IMAGE


def _compose(podman: Podman, project: str, env: dict[str, str]) -> Compose:
    def compose(*args: str) -> str:
        done = subprocess.run(
            [str(PODMAN_COMPOSE), "--project-name", project, "--file", str(COMPOSE), *args],
            env={**podman.env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    return compose


def _promql(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    ) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def test_compose_up_serves_on_seaweedfs_prometheus_watches_and_down_removes_everything(
    podman: Podman, compose_images: None, prometheus_image: str
) -> None:
    """The broker on SeaweedFS, with the monitoring profile's Prometheus scraping it (Grafana's
    image cannot be pulled here: the profile's other services, by name); the data survives
    a graceful stop, and ``down -v`` leaves nothing."""
    project = f"automq-compose-{uuid.uuid4().hex[:6]}"
    port, metrics_port, prometheus_port = free_port(), free_port(), free_port()
    env = {
        "AUTOMQ_PORT": str(port),
        "AUTOMQ_METRICS_PORT": str(metrics_port),
        "AUTOMQ_PROMETHEUS_PORT": str(prometheus_port),
    }
    compose = _compose(podman, project, env)
    try:
        compose(
            "--profile", "monitoring", "up", "--detach", "--no-build", "s3", "broker", "prometheus"
        )
        bootstrap = f"localhost:{port}"
        wait_serving(f"127.0.0.1:{port}", timeout=120)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=5) as r:
            assert r.status == 200
        create_topic(bootstrap, "composed")
        acked = produce(bootstrap, "composed", 2000)
        assert sorted(consume(bootstrap, "composed", ends_of(acked))) == sorted(acked)
        # Prometheus (docker/prometheus.yml, every 5 s) sees the broker up and the records in
        url = f"http://127.0.0.1:{prometheus_port}"
        messages = 'kafka_server_brokertopicmetrics_messagesin_total{job="automq",topic="composed"}'
        deadline = time.monotonic() + 60
        while True:
            try:
                up = _promql(url, 'up{job="automq",instance="broker:9464"}')
                counted = _promql(url, messages)
            except OSError:  # Prometheus still starting
                up, counted = [], []
            if up and counted and float(counted[0]["value"][1]) == len(acked):
                break
            assert time.monotonic() < deadline, (up, counted)
            time.sleep(1)
        assert float(up[0]["value"][1]) == 1
        broker = f"{project}_broker_1"
        assert "s3.data.buckets = s3://automq?endpoint=http://s3:8333" in podman.logs(broker)
        # a graceful stop uploads what the WAL holds to SeaweedFS: exit 0 means it got there
        podman.run("stop", "--time", "30", broker)
        assert podman.run("inspect", broker, "--format", "{{.State.ExitCode}}").strip() == "0"
        podman.run("start", broker)
        wait_serving(f"127.0.0.1:{port}", timeout=120)
        assert sorted(consume(bootstrap, "composed", ends_of(acked))) == sorted(acked)
    finally:
        compose("--profile", "monitoring", "down", "--volumes", "--timeout", "10")
    assert project not in podman.run("ps", "--all", "--format", "{{.Names}}")
    assert project not in podman.run("volume", "ls", "--format", "{{.Name}}")


def test_podman_compose_reads_the_cluster_profile(podman: Podman) -> None:
    compose = _compose(podman, "automq-config", {})
    assert "\n  postgres:\n" not in compose("config")  # the default up leaves it out
    cluster = compose("--profile", "cluster", "config")
    for service in ("postgres:", "broker-0:", "broker-1:", "broker-2:", "broker:", "s3:"):
        assert f"\n  {service}\n" in cluster
    monitoring = compose("--profile", "monitoring", "config")
    for service in ("prometheus:", "grafana:", "broker:", "s3:"):
        assert f"\n  {service}\n" in monitoring
    assert "\n  postgres:\n" not in monitoring


@pytest.fixture
def cluster_project(podman: Podman, postgres_image: str) -> Iterator[tuple[Compose, list[int]]]:
    """The cluster profile up (with the single broker, as ``up`` starts it too) on free host
    ports; ``down -v`` after the test, and nothing of it left."""
    project = f"automq-cluster-{uuid.uuid4().hex[:6]}"
    ports = [free_port() for _ in range(4)]
    env = {
        "AUTOMQ_PORT": str(ports[3]),
        "AUTOMQ_METRICS_PORT": str(free_port()),
        **{f"AUTOMQ_CLUSTER_PORT_{i}": str(port) for i, port in enumerate(ports[:3])},
        "AUTOMQ_POSTGRES_IMAGE": postgres_image,
    }
    compose = _compose(podman, project, env)
    try:
        compose("--profile", "cluster", "up", "--detach", "--no-build")
        yield compose, ports[:3]
    finally:
        # its volumes go too: no container's shutdown matters, and one that waits out the
        # grace period cost this teardown 12 s
        compose("--profile", "cluster", "down", "--volumes", "--timeout", "3")
    assert project not in podman.run("ps", "--all", "--format", "{{.Names}}")
    assert project not in podman.run("volume", "ls", "--format", "{{.Name}}")


def test_the_cluster_profile_serves_one_topic_through_three_brokers(
    podman: Podman, cluster_project: tuple[Compose, list[int]]
) -> None:
    _, ports = cluster_project
    for port in ports:
        wait_serving(f"127.0.0.1:{port}", timeout=180)
    deadline = time.monotonic() + 60
    while any(sorted(listed_brokers(f"127.0.0.1:{port}")) != [0, 1, 2] for port in ports):
        assert time.monotonic() < deadline, [listed_brokers(f"127.0.0.1:{p}") for p in ports]
        time.sleep(0.5)
    assert listed_brokers(f"127.0.0.1:{ports[0]}") == {
        i: f"localhost:{port}" for i, port in enumerate(ports)
    }

    bootstrap = ",".join(f"localhost:{port}" for port in ports)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("clustered", 6, replication_factor=3)])["clustered"].result(30)
    leaders = admin.list_topics("clustered", timeout=30).topics["clustered"].partitions
    assert Counter(p.leader for p in leaders.values()) == {0: 2, 1: 2, 2: 2}
    acked = produce(bootstrap, "clustered", 3000)  # partitions 0-2 of the six
    assert sorted(consume(bootstrap, "clustered", ends_of(acked))) == sorted(acked)
