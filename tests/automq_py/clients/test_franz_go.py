"""franz-go's own integration suite against the real broker process.

The tests of franz-go's ``pkg/kgo`` (its producer, consumer, groups both classic and KIP-848,
transactions, admin requests) run against a broker named by ``KGO_SEEDS``, creating their own
topics and groups. ``make deps`` builds their test binary from the module the Go proxy serves
(``FRANZ_GO`` in the Makefile) into ``.go/``, beside the package's sources, where it runs as
``go test`` would. The tests that need a feature this broker does not
serve skip themselves, as they do against an older Kafka: share groups (KIP-932), and SASL and
OAuth, which need credentials in the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.automq_py.conftest import MakeBroker
from tests.support.go_suite import built, run_suite

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]


def test_franz_go_kgo_suite_passes(make_broker: MakeBroker, tmp_path: Path) -> None:
    binary = built("franz-go-*/kgo.test")
    broker = make_broker()
    env = dict(
        os.environ,
        KGO_SEEDS=broker.bootstrap,
        KGO_TEST_RF="1",  # the replication factor its topics ask for
        KGO_LOG_LEVEL="none",
    )
    run = run_suite(
        binary,
        ["-test.timeout", "540s"],
        cwd=binary.parent / "pkg" / "kgo",  # some of its tests read the package's sources
        env=env,
        log=tmp_path / "kgo.log",
        timeout=600,
    )
    failed, passed = run.named("FAIL"), run.named("PASS")
    assert run.returncode == 0 and not failed, f"failed: {failed}\n{run.text[-6000:]}"
    # the suite ran, its broker-facing tests among what passed
    assert len(passed) > 100 and {"TestGroupETL", "TestTxnEtl"} <= set(passed), passed
