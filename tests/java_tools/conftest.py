"""One broker and one tool runner for the module: the tests name their own topics and groups,
so they share them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.support.java import ToolRun, ToolRunner
from tests.support.seaweedfs import SeaweedFS


@pytest.fixture(scope="module")
def tools_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("tools") / "broker",
        {
            "s3.data.buckets": s3_server.url(),
            "cluster.id": f"t{time.monotonic_ns()}",
            "group.initial.rebalance.delay.ms": "0",
        },
    )
    broker.start()
    try:
        yield broker
    finally:
        code = broker.stop()
        assert code == 0, broker.log_tail()


@dataclass(slots=True, frozen=True)
class KafkaTools:
    """Kafka's tools pointed at one broker: ``tool("kafka-topics", "--list")`` runs
    ``bin/kafka-topics.sh --bootstrap-server <broker> --list``."""

    broker: BrokerProcess
    runner: ToolRunner

    def __call__(self, name: str, *args: str, **kw: Any) -> ToolRun:
        return self.runner.run(name, "--bootstrap-server", self.broker.bootstrap, *args, **kw)


@pytest.fixture(scope="module")
def tool(tools_broker: BrokerProcess) -> Iterator[KafkaTools]:
    runner = ToolRunner(Path(tools_broker.data_dir.parent) / "tool-runner.log")
    try:
        yield KafkaTools(tools_broker, runner)
    finally:
        runner.close()
