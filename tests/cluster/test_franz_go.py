"""franz-go's own integration suite against a three-broker cluster.

The same tests of franz-go's ``pkg/kgo`` that ``tests/automq_py/clients/test_franz_go.py`` runs
against one broker, here seeded with every broker of a cluster: leaders spread over three
brokers, each group's and transactional id's coordinator on whichever broker leads its
partition, and produce, fetch, commits and transaction markers crossing between them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import ClusterFactory
from tests.support.go_suite import assert_kgo_suite_passes

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]


def test_franz_go_kgo_suite_passes_against_a_cluster(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    assert_kgo_suite_passes(cluster_factory(3).bootstrap, tmp_path / "kgo.log")
