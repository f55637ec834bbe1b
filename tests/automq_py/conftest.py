"""The broker fixture: the real broker process, storing in the session's real S3 server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS


@pytest.fixture
def broker(tmp_path: Path, s3_server: SeaweedFS) -> Iterator[BrokerProcess]:
    """A fresh broker (its own data directory and cluster id); it must stop cleanly."""
    b = BrokerProcess(
        tmp_path / "broker",
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"t{time.monotonic_ns()}"},
    )
    b.start()
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_tail()
