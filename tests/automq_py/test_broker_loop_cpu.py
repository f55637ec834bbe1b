"""event.loop.pin.cpu on a served broker: its event loop's thread (the process's main thread)
runs on one CPU, and with it the kernel's io_uring workers its WAL writes wake; every other
thread runs on all of the process's CPUs, before and after the broker has served records. Set
false, every thread is left to the OS."""

from __future__ import annotations

import os
import time

from confluent_kafka import Producer

from automq_py.testing.process import AutoMQProcess
from tests.storage.test_loop_cpu import CPUS, _allowed


def _threads(pid: int, *, io_workers: bool = True) -> dict[int, set[int]]:
    """Each thread of ``pid`` and the CPUs it may run on (``io_workers``: with the kernel's
    io_uring workers, ``iou-wrk-*``)."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if not io_workers and f.read().startswith("iou-"):
                continue
        threads[int(tid)] = _allowed(pid, int(tid))
    return threads


def _pinned(broker: AutoMQProcess) -> bool:
    """Whether the broker has logged its loop pinned (just after it starts serving)."""
    deadline = time.monotonic() + 10
    while "event loop pinned to CPU" not in broker.log_tail(200):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(2000):
        producer.produce("pinned", b"x" * 512, partition=i % 2)
        producer.poll(0)
    assert producer.flush(30) == 0


def test_the_event_loops_thread_runs_on_one_cpu_and_the_rest_on_all() -> None:
    with AutoMQProcess({"num.partitions": "2"}) as broker:
        assert broker.pid is not None
        assert _pinned(broker)
        for _ in range(2):  # as started, then once it has served
            threads = _threads(broker.pid, io_workers=False)
            loop_cpus = threads.pop(broker.pid)
            assert len(loop_cpus) == 1 and loop_cpus < CPUS
            assert threads and all(cpus == CPUS for cpus in threads.values()), threads
            _produce(broker.bootstrap_servers)
        workers = set(_threads(broker.pid)) - set(_threads(broker.pid, io_workers=False))
        assert workers, "the WAL's writes woke no io_uring worker"
        assert all(_allowed(broker.pid, tid) == loop_cpus for tid in workers)


def test_pinning_off_leaves_the_loops_thread_to_the_os() -> None:
    with AutoMQProcess({"event.loop.pin.cpu": "false"}) as broker:
        assert broker.pid is not None
        _produce(broker.bootstrap_servers)
        assert set(map(frozenset, _threads(broker.pid).values())) == {frozenset(CPUS)}
        assert "pinned to CPU" not in broker.log_tail(200)
