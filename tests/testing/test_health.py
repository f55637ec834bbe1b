"""``python -m automq_py.health``: the container's health check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from automq_py.health import check
from tests.support.broker import free_port

pytestmark = pytest.mark.integration


def test_a_serving_broker_is_healthy(kafka_bootstrap: str) -> None:
    host, port = kafka_bootstrap.rsplit(":", 1)
    assert check(host, int(port), 3.0) is None
    done = subprocess.run([sys.executable, "-m", "automq_py.health", kafka_bootstrap])
    assert done.returncode == 0


def test_nothing_listening_is_unhealthy() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    assert check("127.0.0.1", int(bootstrap.rsplit(":", 1)[1]), 1.0) is not None
    done = subprocess.run(
        [sys.executable, "-m", "automq_py.health", bootstrap], capture_output=True, text=True
    )
    assert done.returncode == 1 and "unhealthy" in done.stderr
