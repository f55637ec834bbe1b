"""docker/compose.yml under podman-compose: the broker on SeaweedFS in one ``up``, reached from
the host, and everything gone after ``down -v``."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.docker.test_image import consume, create_topic, ends_of, produce, wait_serving
from tests.support.broker import REPO, free_port
from tests.support.podman import IMAGE, Podman

pytestmark = pytest.mark.integration

COMPOSE = REPO / "docker" / "compose.yml"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"


def test_compose_up_serves_on_seaweedfs_and_down_removes_everything(
    podman: Podman, automq_image: str
) -> None:
    # the images compose.yml names, built here (no registry, the local base, the CA secret)
    podman.run("tag", IMAGE, "localhost/automq-py:latest")
    podman.build_image("docker/seaweedfs.Dockerfile", "localhost/automq-py-seaweedfs:latest")
    project = f"automq-compose-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {**podman.env, "AUTOMQ_PORT": str(port)}

    def compose(*args: str) -> str:
        done = subprocess.run(
            [str(PODMAN_COMPOSE), "--project-name", project, "--file", str(COMPOSE), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        compose("up", "--detach", "--no-build")
        bootstrap = f"localhost:{port}"
        wait_serving(f"127.0.0.1:{port}", timeout=120)
        create_topic(bootstrap, "composed")
        acked = produce(bootstrap, "composed", 2000)
        assert sorted(consume(bootstrap, "composed", ends_of(acked))) == sorted(acked)
        broker = f"{project}_broker_1"
        assert "s3.data.buckets = s3://automq?endpoint=http://s3:8333" in podman.logs(broker)
        # a graceful stop uploads what the WAL holds to SeaweedFS: exit 0 means it got there
        podman.run("stop", "--time", "30", broker)
        assert podman.run("inspect", broker, "--format", "{{.State.ExitCode}}").strip() == "0"
        podman.run("start", broker)
        wait_serving(f"127.0.0.1:{port}", timeout=120)
        assert sorted(consume(bootstrap, "composed", ends_of(acked))) == sorted(acked)
    finally:
        compose("down", "--volumes", "--timeout", "10")
    assert project not in podman.run("ps", "--all", "--format", "{{.Names}}")
    assert project not in podman.run("volume", "ls", "--format", "{{.Name}}")
