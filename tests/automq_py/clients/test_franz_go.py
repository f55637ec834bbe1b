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

from pathlib import Path

import pytest

from tests.automq_py.conftest import MakeBroker
from tests.support.go_suite import assert_kgo_suite_passes

# the Go clients' suites (each a busy set of clients) run one after the other, on one worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("go-suites")]


def test_franz_go_kgo_suite_passes(make_broker: MakeBroker, tmp_path: Path) -> None:
    assert_kgo_suite_passes(make_broker().bootstrap, tmp_path / "kgo.log")
