"""The controller role at run time: every broker runs one; the holder of the lease acts.

Each round (every ``broker.heartbeat.interval.ms``) a broker takes or renews the controller lease
(:class:`ControllerLease`). The holder, having first recorded itself as controller in the
metadata (so a former controller's changes are refused from then on):

1. fences every broker whose heartbeats stood still for ``broker.session.timeout.ms``;
2. gives the partitions of brokers that are gone (fenced, or shutting down on SIGTERM) and the
   offline ones new leaders (:func:`plan_failover`);
3. when a broker joined, evens out leadership (:func:`plan_rebalance`).

Every decision is a pure plan over the image, committed through the metadata manager with the
controller's record checked. The new leader opens a partition only once the previous one has
closed it (see ``ReplicaManager``), so a move never fences data that was not yet durable: a
fenced broker on the file WAL keeps its partitions unavailable until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from automq_py.controller import membership
from automq_py.controller.cluster_records import NO_LEADER, BrokerRegistration, ControllerRecord
from automq_py.controller.liveness import ControllerLease, HeartbeatMonitor
from automq_py.controller.placement import LeaderChanges, plan_failover, plan_rebalance
from automq_py.metadata_cache import ClusterMetadataCache
from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.records import Record
from storage.metadata.store import ConditionFailedError

log = logging.getLogger("automq.controller")


class ClusterController:
    def __init__(
        self,
        node_id: int,
        url: str,
        metadata: MetadataManager,
        cache: ClusterMetadataCache,
        heartbeat_interval_ms: int,
        session_timeout_ms: int,
        *,
        rebalance: bool = True,
        recover_wal: Callable[[int, int], Awaitable[bool]] | None = None,
    ) -> None:
        self.node_id = node_id
        self._rebalances = rebalance  # auto.leader.rebalance.enable
        # with the WAL in object storage: recovers a fenced broker's WAL on its behalf
        self._recover_wal = recover_wal
        self._recovering: dict[int, asyncio.Task[None]] = {}
        self._metadata = metadata
        self._cache = cache
        self._interval_s = heartbeat_interval_ms / 1000
        self._session_s = session_timeout_ms / 1000
        self.lease = ControllerLease(
            url, node_id, lease_ms=session_timeout_ms, margin_ms=heartbeat_interval_ms
        )
        self._monitor = HeartbeatMonitor(url, recent_s=2 * self._interval_s)
        self._me: ControllerRecord | None = None
        self._since: float = 0.0  # when this broker became controller (monotonic)
        self._known_live: frozenset[int] | None = None
        self._registered_seen: dict[tuple[int, int], float] = {}
        # (node, node epoch) of a fenced broker's new start, when this controller first saw it
        self._restarts_seen: dict[tuple[int, int], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # a broker registering or starting to shut down is acted on at once, not next round
        cache.add_brokers_listener(self.wake)

    @property
    def active(self) -> bool:
        """Whether this broker acts as the controller now."""
        return self._me is not None and self.lease.holds()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="controller")

    def wake(self) -> None:
        """Run a round now (a broker is shutting down: its partitions should move at once)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop acting; give the lease up so another broker takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for recovery in list(self._recovering.values()):  # the next controller starts again
            recovery.cancel()
            with contextlib.suppress(BaseException):
                await recovery
        if self._me is not None:
            await self.lease.release()
        await self.lease.close()
        await self._monitor.close()

    async def _run(self) -> None:
        while True:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store unreachable, a refused change: next round
                log.warning("controller round: %s: %s", type(e).__name__, e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._until_next_round()):
                    await self._wake.wait()
            self._wake.clear()

    def _until_next_round(self) -> float:
        """Seconds to the next round: a heartbeat interval, or less when a broker's session
        runs out sooner (then a silent broker is fenced at its session timeout, not up to an
        interval later)."""
        wait = self._interval_s
        if self._me is None:
            return wait
        for broker in self._cache.brokers().values():
            if not broker.fenced:
                left = self._session_s - self._silent(broker)
                wait = min(wait, max(left, 0.0) + 0.01)
        return max(wait, 0.05)

    async def _round(self) -> None:
        failed = self._metadata.failed
        if failed is not None:
            # an image that no longer follows the log can have no decision committed: the
            # lease goes to a broker that can act (and fence this one, silent from now on)
            if self._me is not None or self.lease.holds():
                log.error(
                    "broker %d gives the controller role up: its metadata stopped following "
                    "the log (%s)",
                    self.node_id,
                    failed,
                )
                await self.lease.release()
            self._me = None
            return
        try:
            held = await self.lease.acquire_or_renew()
        except Exception as e:
            held = False
            log.debug("controller lease: %s", e)
            # (the heartbeats went unread meanwhile: their silence is the outage's, not theirs)
            self._monitor.database_unreachable()
        if not held:
            if self._me is not None:
                log.info("broker %d is no longer the controller", self.node_id)
            self._me = None
            return
        me = ControllerRecord(self.node_id, self.lease.epoch)
        if self._me != me:
            await self._metadata.change(
                lambda image: (membership.claim_controller(image, me), None)
            )
            self._me = me
            self._since = time.monotonic()
            self._known_live = None
            self._monitor.restart_sessions()
            log.info("broker %d is the controller (lease epoch %d)", self.node_id, me.epoch)
        await self._monitor.poll()
        if not self.lease.holds():
            return
        for broker in self._cache.brokers().values():
            if not broker.fenced and self._silent(broker) > self._session_s:
                await self._fence(me, broker)
        self._recover_fenced()
        self._forget_old_sightings()
        await self._fail_over(me)
        await self._rebalance(me)

    def _forget_old_sightings(self) -> None:
        """Drop the first sightings of registrations and starts that are no longer a broker's
        latest: one of each a broker start, kept for as long as it is current."""
        brokers = self._cache.brokers()
        nodes = self._metadata.image.nodes
        self._registered_seen = {
            key: seen
            for key, seen in self._registered_seen.items()
            if (b := brokers.get(key[0])) is not None and b.incarnation == key[1]
        }
        self._restarts_seen = {
            key: seen
            for key, seen in self._restarts_seen.items()
            if (n := nodes.get(key[0])) is not None and n.epoch == key[1]
        }

    def _silent(self, broker: BrokerRegistration) -> float:
        """How long ``broker`` has been silent, as far as this controller knows."""
        silent = self._monitor.silent_for(broker.node_id)
        if silent is None or self._monitor.incarnation(broker.node_id) != broker.incarnation:
            # registered, not heard from in this incarnation yet: silent since this controller
            # first saw the registration (or took over, whichever is later)
            key = (broker.node_id, broker.incarnation)
            first_seen = self._registered_seen.setdefault(key, time.monotonic())
            return time.monotonic() - max(first_seen, self._since)
        return silent

    async def _fence(self, me: ControllerRecord, broker: BrokerRegistration) -> None:
        log.warning(
            "fencing broker %d (incarnation %d): no heartbeat for %.1f s",
            broker.node_id,
            broker.incarnation,
            self._silent(broker),
        )

        def plan(image: MetadataImage) -> tuple[list[Record], None]:
            return membership.fence_broker(image, me, broker.node_id, broker.incarnation), None

        try:
            # only while its heartbeats still stand where this controller judged them silent:
            # one that beat meanwhile is back in its session, and may have caught up already
            await self._metadata.change(plan, self._monitor.unchanged(broker.node_id))
        except ConditionFailedError:
            log.info("broker %d beat just now: not fenced", broker.node_id)

    def _recover_fenced(self) -> None:
        """Have the WAL of every fenced broker that still has streams open recovered (its
        unuploaded records uploaded, its streams closed), so the brokers now leading its
        partitions open them with every record it acknowledged."""
        if self._recover_wal is None:
            return
        image = self._metadata.image
        for broker in self._cache.brokers().values():
            node = broker.node_id
            if not broker.fenced or node in self._recovering or node == self.node_id:
                continue
            if not image.streams_opened_by(node):
                continue
            meta = image.nodes.get(node)
            if meta is None:
                continue
            if not meta.failover:
                # its node epoch is its own, not the fence's: started again and recovering its
                # WAL before it registers, left to it unless that start has been silent for a
                # session (it died too)
                first_seen = self._restarts_seen.setdefault((node, meta.epoch), time.monotonic())
                if time.monotonic() - max(first_seen, self._since) <= self._session_s:
                    continue
            log.warning("recovering the WAL of fenced broker %d (node epoch %d)", node, meta.epoch)
            task = asyncio.create_task(
                self._recover_one(node, meta.epoch), name=f"recover-wal-{node}"
            )
            self._recovering[node] = task

    async def _recover_one(self, node: int, epoch: int) -> None:
        assert self._recover_wal is not None
        try:
            # only while ``epoch`` is the node's latest: a broker that started again meanwhile
            # recovers its WAL itself, and a new node epoch now would fence that recovery
            await self._recover_wal(node, epoch)
        except Exception as e:  # the next round tries again
            log.warning("recovering the WAL of broker %d: %s: %s", node, type(e).__name__, e)
        finally:
            del self._recovering[node]
            self.wake()

    async def _fail_over(self, me: ControllerRecord) -> None:
        """New leaders for the partitions of brokers that are gone, and for offline ones."""
        brokers = self._cache.brokers()
        gone = [b.node_id for b in brokers.values() if not b.live]
        leaders = self._cache.all_leaders()
        led = {n for t in leaders.values() for n in t.leaders}
        offline = NO_LEADER in led
        for node in gone:
            if node in led:
                await self._move(me, plan_failover(list(brokers.values()), leaders, node), node)
                leaders = self._cache.all_leaders()
                offline = False  # plan_failover placed them too
        if offline:
            await self._move(me, plan_failover(list(brokers.values()), leaders, NO_LEADER), None)

    async def _rebalance(self, me: ControllerRecord) -> None:
        brokers = self._cache.brokers()
        live = frozenset(b.node_id for b in brokers.values() if b.live)
        joined = self._known_live is not None and bool(live - self._known_live)
        self._known_live = live
        if not joined or not self._rebalances:
            return
        moves = plan_rebalance(list(brokers.values()), self._cache.all_leaders())
        if moves:
            # as reassignments: each leader uploads the partition's tail while still serving,
            # then hands it over
            log.info(
                "brokers %s joined: reassigning %d partitions to balance leadership",
                sorted(live),
                sum(len(m) for m in moves.values()),
            )

            def plan(image: MetadataImage) -> tuple[list[Record], None]:
                return membership.request_moves(image, moves, me), None

            await self._metadata.change(plan)

    async def _move(self, me: ControllerRecord, moves: LeaderChanges, gone: int | None) -> None:
        if not moves:
            return
        count = sum(len(m) for m in moves.values())
        if gone is not None:
            log.info("moving %d partitions away from broker %d", count, gone)

        def plan(image: MetadataImage) -> tuple[list[Record], None]:
            return membership.move_leaders(image, me, moves), None

        await self._metadata.change(plan)
