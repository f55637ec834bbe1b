"""franz-go's own integration suite against a three-broker cluster.

The same tests of franz-go's ``pkg/kgo`` that ``tests/automq_py/clients/test_franz_go.py`` runs
against one broker, here seeded with every broker of a cluster: leaders spread over three
brokers, each group's and transactional id's coordinator on whichever broker leads its
partition, and produce, fetch, commits and transaction markers crossing between them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.conftest import ClusterFactory
from tests.support.go_suite import built, run_suite

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]


def test_franz_go_kgo_suite_passes_against_a_cluster(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    binary = built("franz-go-*/kgo.test")
    cluster = cluster_factory(3)
    env = dict(
        os.environ,
        KGO_SEEDS=cluster.bootstrap,
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
    assert len(passed) > 100 and {"TestGroupETL", "TestTxnEtl"} <= set(passed), passed
