"""The file WAL's io_uring workers at real-time priority (``s3.wal.io.realtime``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from storage.wal import FileWAL
from storage.wal.iowq import PRIORITY, WorkerPriority, new_workers

CAPACITY = 64 * 1024

pytestmark = pytest.mark.timeout(60)


def test_new_workers_are_the_io_uring_threads_not_seen_before() -> None:
    comm = {"10": "python", "11": "iou-wrk-10", "12": "iou-sqp-10", "13": "iou-wrk-10"}
    fresh, known = new_workers(["10", "11", "12", "13"], set(), comm)
    assert fresh == [11, 13]
    assert known == {"10", "11", "12", "13"}
    # looked at once: a later look reads nothing again and finds nothing new
    fresh, known = new_workers(["10", "11", "12", "13"], known, {})
    assert fresh == [] and known == {"10", "11", "12", "13"}


def test_threads_that_ended_are_forgotten_and_a_new_worker_is_found() -> None:
    known = {"10", "11", "12"}
    fresh, known = new_workers(["10", "14"], known, {"14": "iou-wrk-10"})
    assert fresh == [14]
    assert known == {"10", "14"}


def test_a_thread_gone_before_its_name_was_read_is_not_remembered() -> None:
    fresh, known = new_workers(["10", "15"], {"10"}, {})
    assert fresh == [] and known == {"10"}


def may_set_realtime() -> bool:
    """Whether this process may give a thread SCHED_FIFO: CAP_SYS_NICE or RLIMIT_RTPRIO."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    if soft == resource.RLIM_INFINITY or soft >= PRIORITY:
        return True
    with open("/proc/self/status") as f:
        caps = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) >> 23 & 1)  # CAP_SYS_NICE


def io_workers() -> list[int]:
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("iou-wrk-"):
                    tids.append(int(tid))
        except OSError:
            continue
    return tids


async def test_the_wals_io_uring_workers_run_at_real_time_priority(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096)
    try:
        assert wal._async is not None, "this machine's kernel offers io_uring"
        assert wal.io_priority is not None
        for i in range(20):
            await wal.append(b"record %d" % i)
        assert io_workers(), "the durable writes went through an io_uring worker"
        wal.io_priority.raise_new()  # (the WAL also looks once a second)
        if may_set_realtime():
            assert wal.io_priority.refused is None
            assert wal.io_priority.raised >= 1
            for tid in io_workers():
                assert os.sched_getscheduler(tid) == os.SCHED_FIFO
                assert os.sched_getparam(tid).sched_priority == PRIORITY
        else:
            assert wal.io_priority.refused is not None
        for i in range(20):  # and the writes go on either way
            await wal.append(b"more %d" % i)
    finally:
        await wal.close()


async def test_realtime_io_false_leaves_the_workers_alone(tmp_path: Path) -> None:
    wal = await FileWAL.open(
        str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096, realtime_io=False
    )
    try:
        assert wal._async is not None
        assert wal.io_priority is None
        await wal.append(b"record")
    finally:
        await wal.close()


def test_a_refusal_is_said_once_and_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = tmp_path / "task"
    for tid, comm in (("100", "python"), ("101", "iou-wrk-100"), ("102", "iou-wrk-100")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "comm").write_text(comm + "\n")
    calls: list[int] = []

    def refuse(tid: int, policy: int, param: os.sched_param) -> None:
        calls.append(tid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    priority = WorkerPriority(str(tasks))
    with caplog.at_level(logging.INFO, logger="storage.wal.iowq"):
        assert priority.raise_new() == 0
        (tasks / "103").mkdir()
        (tasks / "103" / "comm").write_text("iou-wrk-100\n")
        assert priority.raise_new() == 0
    assert calls == [101]
    assert isinstance(priority.refused, PermissionError)
    warnings = [r for r in caplog.records if "s3.wal.io.realtime" in r.getMessage()]
    assert len(warnings) == 1
    assert "CAP_SYS_NICE" in warnings[0].getMessage()
