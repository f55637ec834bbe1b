"""Runs a Go client's own test binary (``go test -c``, built into ``.go/`` by ``make go``) and
reads its verbose output."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).resolve().parents[2] / ".go"


def built(pattern: str) -> Path:
    """The newest binary under ``.go/`` matching ``pattern`` (``sarama-*/sarama.test``)."""
    found = sorted(GO_DIR.glob(pattern))
    assert found, f"run `make deps` first ({pattern} is built into .go/)"
    return found[-1]


@dataclass(frozen=True)
class SuiteRun:
    returncode: int
    text: str  # stdout and stderr, as the binary wrote them

    def named(self, outcome: str) -> list[str]:
        """The tests and subtests reported with ``outcome`` (PASS, FAIL, SKIP)."""
        return re.findall(rf"^\s*--- {outcome}: (\S+)", self.text, re.MULTILINE)


def run_suite(
    binary: Path,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    timeout: float,
) -> SuiteRun:
    """Run ``binary -test.v args`` in ``cwd`` (where its tests read their package's files),
    its output kept in ``log``."""
    with open(log, "wb") as out:
        done = subprocess.run(
            [str(binary), "-test.v", *args],
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    return SuiteRun(done.returncode, log.read_text(errors="replace"))


def assert_kgo_suite_passes(seeds: str, log: Path) -> None:
    """franz-go's ``pkg/kgo`` tests, seeded with ``seeds``: every test passes, at least 100 of
    them, the group and transaction ETL tests among them. They create their own topics and
    groups; some read the package's sources, so they run beside them, as ``go test`` would."""
    binary = built("franz-go-*/kgo.test")
    env = dict(
        os.environ,
        KGO_SEEDS=seeds,
        KGO_TEST_RF="1",  # the replication factor its topics ask for
        KGO_LOG_LEVEL="none",
    )
    run = run_suite(
        binary,
        ["-test.timeout", "540s"],
        cwd=binary.parent / "pkg" / "kgo",
        env=env,
        log=log,
        timeout=600,
    )
    failed, passed = run.named("FAIL"), run.named("PASS")
    assert run.returncode == 0 and not failed, f"failed: {failed}\n{run.text[-6000:]}"
    assert len(passed) > 100 and {"TestGroupETL", "TestTxnEtl"} <= set(passed), passed
