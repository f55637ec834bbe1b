"""Heartbeats and the controller lease against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from automq_py.controller.liveness import (
    ControllerLease,
    HeartbeatMonitor,
    HeartbeatSender,
    RowUnchanged,
)
from storage.metadata import control
from storage.metadata.manager import MetadataManager
from storage.metadata.store import ConditionFailedError, MetadataUnavailableError
from tests.support.postgres import PostgresServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def leases(postgres_url: str) -> AsyncIterator[tuple[ControllerLease, ControllerLease]]:
    a = ControllerLease(postgres_url, 1, lease_ms=600, margin_ms=200)
    b = ControllerLease(postgres_url, 2, lease_ms=600, margin_ms=200)
    yield a, b
    await a.close()
    await b.close()


async def test_one_holder_at_a_time(leases: tuple[ControllerLease, ControllerLease]) -> None:
    a, b = leases
    assert await a.acquire_or_renew()
    assert a.holds() and a.epoch == 1
    assert not await b.acquire_or_renew()
    assert not b.holds()
    assert await a.acquire_or_renew()  # renewing keeps the epoch
    assert a.epoch == 1
    assert await b.holder() == (1, 1)


async def test_an_expired_lease_passes_on_with_a_new_epoch(
    leases: tuple[ControllerLease, ControllerLease],
) -> None:
    a, b = leases
    assert await a.acquire_or_renew()
    await asyncio.sleep(0.45)  # a is frozen: no renewal
    assert not a.holds()  # it stops acting before the lease ends (0.6 s less 0.2 s margin)
    assert not await b.acquire_or_renew()  # the lease itself still runs
    await asyncio.sleep(0.2)
    assert await b.acquire_or_renew()
    assert b.epoch == 2
    assert not await a.acquire_or_renew()  # the former holder cannot renew
    assert not a.holds()


async def test_a_released_lease_is_taken_at_once(
    leases: tuple[ControllerLease, ControllerLease],
) -> None:
    a, b = leases
    assert await a.acquire_or_renew()
    await a.release()
    assert not a.holds()
    assert await b.acquire_or_renew()
    assert b.epoch == 2


async def test_a_broker_silent_past_its_session_is_seen_silent(postgres_url: str) -> None:
    clock = FakeClock()
    monitor = HeartbeatMonitor(postgres_url, clock)
    one = HeartbeatSender(postgres_url, 1)
    two = HeartbeatSender(postgres_url, 2)
    try:
        await one.beat(incarnation=1)
        await two.beat(incarnation=1)
        await monitor.poll()
        assert monitor.silent_for(1) == 0 and monitor.silent_for(2) == 0
        assert monitor.silent_for(3) is None
        for _ in range(5):
            clock.now += 2
            await one.beat(incarnation=1)
            await monitor.poll()
        assert monitor.silent_for(1) == 0
        assert monitor.silent_for(2) == 10  # its count stood still
        clock.now += 1
        await two.beat(incarnation=2)  # restarted
        await monitor.poll()
        assert monitor.silent_for(2) == 0 and monitor.incarnation(2) == 2
    finally:
        await monitor.close()
        await one.close()
        await two.close()


async def test_an_outage_of_the_database_fences_nobody() -> None:
    clock = FakeClock()
    with PostgresServer() as server:
        url = server.create_database()
        monitor = HeartbeatMonitor(url, clock)
        sender = HeartbeatSender(url, 1)
        try:
            await sender.beat(incarnation=1)
            await monitor.poll()
            server.pause()
            clock.now += 30
            with pytest.raises(MetadataUnavailableError):
                await sender.beat(incarnation=1)
            with pytest.raises(MetadataUnavailableError):
                await monitor.poll()
            server.resume()
            await monitor.poll()  # the first read after the outage starts sessions afresh
            assert monitor.silent_for(1) == 0
            clock.now += 5
            await monitor.poll()
            assert monitor.silent_for(1) == 5
            await sender.beat(incarnation=1)  # reconnects by itself
            await monitor.poll()
            assert monitor.silent_for(1) == 0
        finally:
            await monitor.close()
            await sender.close()


async def test_a_new_controller_takes_up_how_long_brokers_have_been_silent(
    postgres_url: str,
) -> None:
    """A broker that died with the old controller is fenced a session after its last heartbeat,
    by PostgreSQL's clock; when nobody's heartbeats are recent (the database was away), every
    session starts afresh instead."""
    one = HeartbeatSender(postgres_url, 11)
    two = HeartbeatSender(postgres_url, 12)
    monitors: list[HeartbeatMonitor] = []
    try:
        await one.beat(incarnation=1)
        await two.beat(incarnation=1)
        await asyncio.sleep(1.5)
        await one.beat(incarnation=1)  # still alive; twelve is not
        monitor = HeartbeatMonitor(postgres_url, recent_s=1.0)
        monitors.append(monitor)
        monitor.restart_sessions()
        await monitor.poll()
        assert (monitor.silent_for(11) or 0) < 0.5
        assert 1.4 < (monitor.silent_for(12) or 0) < 5
        await asyncio.sleep(1.2)  # now nobody beat within recent_s
        stale = HeartbeatMonitor(postgres_url, recent_s=1.0)
        monitors.append(stale)
        stale.restart_sessions()
        await stale.poll()
        assert stale.silent_for(11) == pytest.approx(0, abs=0.1)
        assert stale.silent_for(12) == pytest.approx(0, abs=0.1)
    finally:
        for m in monitors:
            await m.close()
        await one.close()
        await two.close()


async def test_silence_from_before_the_database_was_away_is_not_taken_up(
    postgres_url: str,
) -> None:
    """A controller that took the lease after an outage of the database (its renewals failed)
    finds one broker whose first heartbeat since has landed and another whose next one is still
    due: the second was silent through the outage, as everyone was, and is not fenced for it."""
    clock = FakeClock()
    one = HeartbeatSender(postgres_url, 21)
    two = HeartbeatSender(postgres_url, 22)
    monitor = HeartbeatMonitor(postgres_url, clock, recent_s=1.0)
    try:
        await one.beat(incarnation=1)
        await two.beat(incarnation=1)
        await asyncio.sleep(1.5)
        monitor.database_unreachable()  # the lease's renewal failed while it was away
        clock.now += 0.3
        await one.beat(incarnation=1)  # back: twenty-one beat, twenty-two's beat is due
        monitor.restart_sessions()  # the lease taken again, at a new epoch
        await monitor.poll()
        assert monitor.silent_for(22) == pytest.approx(0.3)
        assert (monitor.silent_for(21) or 0) <= 0.3
        clock.now += 2.0
        await monitor.poll()
        assert monitor.silent_for(22) == pytest.approx(2.3)  # from then on its silence counts
    finally:
        await monitor.close()
        await one.close()
        await two.close()


async def _fence_on(manager: MetadataManager, condition: RowUnchanged) -> None:
    """A change persisted on ``condition`` (what the controller's fence is)."""
    await manager.change(lambda _image: (control.put_kv("fenced", b"31"), None), condition)


async def test_a_fence_is_persisted_only_while_the_heartbeats_stand_where_they_were_seen(
    postgres_url: str,
) -> None:
    sender = HeartbeatSender(postgres_url, 31)
    monitor = HeartbeatMonitor(postgres_url, FakeClock())
    manager = await MetadataManager.open(postgres_url)
    try:
        await monitor.poll()
        never_beat = monitor.unchanged(31)
        await sender.beat(incarnation=4)
        with pytest.raises(ConditionFailedError):
            await _fence_on(manager, never_beat)
        await monitor.poll()
        seen = monitor.unchanged(31)
        await sender.beat(incarnation=4)  # the broker beat after the controller's last poll
        with pytest.raises(ConditionFailedError):
            await _fence_on(manager, seen)
        assert "fenced" not in manager.image.kv
        await monitor.poll()
        await _fence_on(manager, monitor.unchanged(31))
        assert manager.image.kv["fenced"] == b"31"
    finally:
        await manager.close()
        await monitor.close()
        await sender.close()


async def test_a_heartbeat_committed_while_the_fence_waits_for_its_row_drops_the_fence(
    postgres_url: str,
) -> None:
    """The broker's heartbeat holds its row (uncommitted) when the fence's statement reaches
    it: the statement waits, then finds the count moved on, and persists nothing."""
    sender = HeartbeatSender(postgres_url, 32)
    monitor = HeartbeatMonitor(postgres_url, FakeClock())
    manager = await MetadataManager.open(postgres_url)
    beating = await asyncpg.connect(postgres_url)
    try:
        await sender.beat(incarnation=1)
        await monitor.poll()
        seen = monitor.unchanged(32)
        beat = beating.transaction()
        await beat.start()
        await beating.execute(
            "UPDATE broker_heartbeats SET beats = beats + 1, seen_at = now() WHERE node_id = 32"
        )
        fence = asyncio.create_task(_fence_on(manager, seen))
        await asyncio.sleep(0.3)
        assert not fence.done()  # waiting for the row
        await beat.commit()
        with pytest.raises(ConditionFailedError):
            await fence
        await manager.catch_up()
        assert "fenced" not in manager.image.kv
    finally:
        await beating.close()
        await manager.close()
        await monitor.close()
        await sender.close()


async def test_a_heartbeat_racing_a_committed_fence_lands_after_it(postgres_url: str) -> None:
    """Once the fence's statement holds the broker's row, the broker's heartbeat waits for the
    fence to commit: the catch-up that follows the heartbeat sees it."""
    sender = HeartbeatSender(postgres_url, 33)
    monitor = HeartbeatMonitor(postgres_url, FakeClock())
    fencing = await asyncpg.connect(postgres_url)
    try:
        await sender.beat(incarnation=1)
        await monitor.poll()
        held_sql, args = monitor.unchanged(33).select(1)
        fence = fencing.transaction()
        await fence.start()
        assert await fencing.fetch(held_sql, *args)  # the fence's hold on the row
        beat = asyncio.create_task(sender.beat(incarnation=1))
        await asyncio.sleep(0.3)
        assert not beat.done()
        await fence.commit()
        await asyncio.wait_for(beat, 5)
    finally:
        await fencing.close()
        await monitor.close()
        await sender.close()


async def test_a_store_of_one_broker_takes_no_condition() -> None:
    manager = await MetadataManager.open("sqlite://:memory:")
    try:
        with pytest.raises(ValueError, match="PostgreSQL"):
            await _fence_on(manager, RowUnchanged(1, 1, 1))
    finally:
        await manager.close()
