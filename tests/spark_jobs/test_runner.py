"""The runners on real PySpark (local[2]) and in-process, and the job commands' CLI."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_py.cli import main
from automq_py.cli.jobs import format_host_port, parse_host_port
from spark_jobs import submit
from spark_jobs.runner import (
    LocalRunner,
    RunnerError,
    SparkRunner,
    UnitFailedError,
    make_runner,
    run_units,
    spark_available,
)


# Units are module-level functions: Spark's Python workers import this module to run them.
def square(unit: int) -> tuple[int, int, int, str]:
    return unit, unit * unit, os.getpid(), sys.executable


def fail_on_three(unit: int) -> int:
    if unit == 3:
        raise ValueError(f"bad unit {unit}")
    time.sleep(0.2)
    return unit


def uses_asyncio_run(unit: int) -> int:
    async def double() -> int:
        await asyncio.sleep(0)
        return unit * 2

    return asyncio.run(double())


@pytest.fixture(scope="module")
def spark_runner(request: pytest.FixtureRequest) -> Iterator[SparkRunner]:
    """One local[2] SparkContext for the module; its Python workers can import ``tests``."""
    root = str(request.config.rootpath)
    with pytest.MonkeyPatch.context() as mp:
        # The JVM starts with the context and hands its PYTHONPATH to the workers.
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.getenv("PYTHONPATH")])))
        runner = SparkRunner("local[2]", app_name="automq-py-tests")
        runner.context  # noqa: B018  (start it now, with this environment)
    yield runner
    runner.close()


def test_spark_runner_returns_every_result(spark_runner: SparkRunner) -> None:
    results = list(spark_runner.map(square, list(range(6)), desc="squares"))
    assert sorted(r[:2] for r in results) == [(i, i * i) for i in range(6)]
    # Units ran in Spark's Python workers, on this venv's python.
    assert all(pid != os.getpid() for _, _, pid, _ in results)
    assert {executable for *_, executable in results} == {sys.executable}
    assert spark_runner.context.master == "local[2]"
    assert spark_runner.startup_seconds is not None


def test_spark_runner_failing_unit_raises_with_its_index(spark_runner: SparkRunner) -> None:
    with pytest.raises(UnitFailedError, match=r"unit 3 failed: ValueError: bad unit 3") as e:
        list(spark_runner.map(fail_on_three, list(range(6)), desc="failing"))
    assert e.value.index == 3
    # The context survives a failed map.
    assert sorted(spark_runner.map(fail_on_three, [0, 1])) == [0, 1]


def test_spark_runner_with_no_units_starts_nothing() -> None:
    runner = SparkRunner("local[1]")
    assert list(runner.map(square, [])) == []
    assert runner.startup_seconds is None


@pytest.mark.parametrize("workers", [1, 3])
def test_local_runner_returns_every_result(workers: int) -> None:
    with LocalRunner(workers) as runner:
        results = list(runner.map(square, list(range(6)), desc="squares"))
    assert sorted(r[:2] for r in results) == [(i, i * i) for i in range(6)]
    assert {pid for _, _, pid, _ in results} == {os.getpid()}


def test_local_runner_failing_unit_raises_with_its_index() -> None:
    with pytest.raises(UnitFailedError, match=r"unit 3 failed: ValueError\('bad unit 3'\)") as e:
        list(LocalRunner(2).map(fail_on_three, list(range(6))))
    assert e.value.index == 3
    assert isinstance(e.value.__cause__, ValueError)


async def test_units_may_call_asyncio_run_when_mapped_from_async_code() -> None:
    assert sorted(await run_units(LocalRunner(), uses_asyncio_run, [1, 2, 3])) == [2, 4, 6]


def test_spark_is_available_here() -> None:
    ok, why = spark_available()
    assert ok, why
    assert "pyspark 4.2.0" in why


def test_make_runner() -> None:
    auto = make_runner("auto", None)
    assert isinstance(auto, SparkRunner) and auto.master is None
    on_master = make_runner("auto", "local[2]")
    assert isinstance(on_master, SparkRunner) and on_master.master == "local[2]"
    assert isinstance(make_runner("spark", None), SparkRunner)
    local = make_runner("local", None, local_workers=3)
    assert isinstance(local, LocalRunner) and local.max_workers == 3
    with pytest.raises(RunnerError, match="--master"):
        make_runner("local", "local[2]")
    with pytest.raises(ValueError, match="runner must be one of"):
        make_runner("yarn", None)


@pytest.mark.parametrize("command", ["compact", "retention", "gc"])
def test_job_command_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert f"automq-py {command}" in out
    for option in ("--config", "--override", "--s3-url", "--bootstrap-server", "--dry-run"):
        assert option in out
    assert ("--kind" in out) == (command == "compact")


def test_bad_override_exits_2_naming_the_property() -> None:
    automq_py = Path(sys.executable).with_name("automq-py")
    done = subprocess.run(
        [str(automq_py), "retention", "--override", "s3.wal.capacity=abc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "automq-py retention: s3.wal.capacity" in done.stderr


def test_unreachable_broker_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["gc", "--runner", "local", "--bootstrap-server", f"127.0.0.1:{port}"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"cannot reach the broker at 127.0.0.1:{port} (connection refused)" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compact", "--runner", "local", "--master", "local[2]"], "--master needs"),
        (["compact", "--bootstrap-server", "broker1"], "is not HOST:PORT"),
        (["gc", "--bootstrap-server", "broker1:99999"], "is not HOST:PORT"),
    ],
)
def test_bad_usage_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_submit_refuses_options_spark_submit_owns(capsys: pytest.CaptureFixture[str]) -> None:
    assert submit.main(["compact", "--master", "yarn"]) == 2
    assert submit.main(["compact", "--runner=local"]) == 2
    assert submit.main(["serve"]) == 2
    assert "runs compact, retention, gc" in capsys.readouterr().err


def test_host_port() -> None:
    assert parse_host_port("broker1:9092") == ("broker1", 9092)
    assert parse_host_port("[::1]:9092") == ("::1", 9092)
    assert parse_host_port("::1:9092") is None
    assert parse_host_port("broker1:0") is None
    assert format_host_port("::1", 9092) == "[::1]:9092"
    assert format_host_port("10.0.0.1", 9092) == "10.0.0.1:9092"
