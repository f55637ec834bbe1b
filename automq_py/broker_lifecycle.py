"""A broker's membership of its cluster: registration, heartbeats, controlled shutdown.

Kafka's ``BrokerLifecycleManager``. At start the broker registers (its incarnation is the node
epoch its storage registered, new at every start) with where clients reach it and its rack,
then sends a heartbeat every ``broker.heartbeat.interval.ms``. On SIGTERM it asks to shut down
(no partition is placed on it any more), wakes the controller, and waits until every partition
it led is led elsewhere, each closed here first (its tail made durable), before it stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from automq_py.controller import membership
from automq_py.controller.cluster_controller import ClusterController
from automq_py.controller.cluster_records import BrokerRegistration
from automq_py.controller.liveness import HeartbeatSender
from automq_py.metadata_cache import ClusterMetadataCache
from storage.metadata import control
from storage.metadata.image import MetadataImage
from storage.metadata.model import ErrorCode as MetadataCode
from storage.metadata.model import MetadataError
from storage.metadata.records import Record
from storage.s3_storage import S3Storage
from storage.wal.errors import WALError

log = logging.getLogger("automq.lifecycle")


class BrokerLifecycle:
    def __init__(
        self,
        registration: BrokerRegistration,
        url: str,
        storage: S3Storage,
        cache: ClusterMetadataCache,
        controller: ClusterController,
        heartbeat_interval_ms: int,
        session_timeout_ms: int,
    ) -> None:
        self.registration = registration
        self._storage = storage
        self._metadata = storage.metadata
        self._cache = cache
        self._controller = controller
        self._interval_s = heartbeat_interval_ms / 1000
        self._session_s = session_timeout_ms / 1000
        self._sender = HeartbeatSender(url, registration.node_id)
        self._task: asyncio.Task[None] | None = None
        self._last_beat = float("-inf")  # monotonic start of the last successful heartbeat

    @property
    def node_id(self) -> int:
        return self.registration.node_id

    async def register(self) -> None:
        """Register this incarnation and send its first heartbeat."""
        registration = self.registration
        # a heartbeat row before the registration: the controller's fence of this broker is
        # then always conditional on a row it can lock (see ``liveness.RowUnchanged``)
        await self._sender.beat(registration.incarnation)
        await self._metadata.change(
            lambda image: (membership.register_broker(image, registration), None)
        )
        await self._beat()
        log.info(
            "broker %d registered (incarnation %d, %s:%d%s)",
            registration.node_id,
            registration.incarnation,
            registration.host,
            registration.port,
            f", rack {registration.rack}" if registration.rack else "",
        )
        self._task = asyncio.create_task(self._heartbeats(), name="heartbeats")

    def in_session(self) -> bool:
        """Whether the controller cannot have fenced this broker yet: its last heartbeat
        started less than the session timeout (less one interval) ago."""
        return time.monotonic() - self._last_beat < self._session_s - self._interval_s

    @property
    def fenced(self) -> bool:
        current = self._cache.broker(self.node_id)
        return (
            current is not None
            and current.incarnation == self.registration.incarnation
            and current.fenced
        )

    async def _beat(self) -> None:
        started = time.monotonic()
        await self._sender.beat(self.registration.incarnation)
        if not self.in_session():
            # Out of session before this heartbeat landed (frozen, cut off, or the heartbeat
            # itself held up): the controller may have fenced this incarnation meanwhile, and
            # this broker's image may not show it yet. The session counts again only once the
            # image holds what was committed up to this beat, so acknowledgements held
            # meanwhile are answered by ``fenced`` as it really is.
            await self._metadata.catch_up()
        self._last_beat = started

    async def _heartbeats(self) -> None:
        warned = False
        while True:
            await asyncio.sleep(self._interval_s)
            failed = self._storage.failed
            if failed is not None:
                # its partitions refuse every append: no more heartbeats, so that the
                # controller fences this broker and has them led elsewhere (from the WAL in
                # object storage; a file WAL's tail waits for this broker's restart)
                log.error(
                    "storage failed (%s): no more heartbeats, the controller is to fence this "
                    "broker and move its partitions; restart it to recover its WAL",
                    failed,
                )
                return
            try:
                if self.fenced:
                    await self._rejoin()
                await self._beat()
                warned = False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not warned:
                    log.warning("heartbeat failed (retrying): %s", e)
                    warned = True

    async def _rejoin(self) -> None:
        """Fenced (frozen or cut off past the session timeout) while still running: register
        again as a new incarnation. Its partitions were given to other brokers; what it had not
        uploaded yet is uploaded under the new node epoch and its streams are closed, so the new
        leaders, who wait for that, open them with every acknowledged record."""
        old = self.registration.incarnation
        log.error(
            "broker %d was fenced by the controller (incarnation %d): registering again",
            self.node_id,
            old,
        )
        storage = self._storage
        try:
            epoch = await self._metadata.register_node(self.node_id, rejoining=storage.node_epoch)
        except MetadataError as e:
            if e.code != MetadataCode.NODE_EPOCH_EXPIRED:
                raise
            # The controller recovered this node's WAL in objects while it was fenced (a new
            # node epoch, and an epoch record that fences every WAL object this process
            # writes from now on): what it appended meanwhile was never acknowledged, but
            # nothing it wrote to that WAL from now on could be recovered. Only a start opens
            # the WAL anew, so this process takes no more appends and stops its heartbeats.
            storage.fail(
                WALError(
                    f"node {self.node_id}'s WAL was recovered by the controller while this "
                    f"broker was fenced ({e}): restart the broker to rejoin the cluster"
                )
            )
            return
        storage.node_epoch = epoch
        await storage.force_upload()
        node_id = self.node_id
        await self._metadata.change(
            lambda image: (control.close_node_streams(image, node_id, epoch), None)
        )
        self.registration = replace(self.registration, incarnation=epoch)
        registration = self.registration
        await self._metadata.change(
            lambda image: (membership.register_broker(image, registration), None)
        )
        await self._beat()  # the controller hears of this incarnation at once
        log.info("broker %d registered again (incarnation %d)", node_id, epoch)

    async def controlled_shutdown(
        self, timeout_s: float, prepare: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Have this broker's partitions led elsewhere before it stops (each is closed here
        first as its leadership moves); gives up after ``timeout_s``. ``prepare`` runs first,
        while the partitions are still served here (it uploads their tails, so each close has
        only what arrives meanwhile left to upload)."""
        node_id, incarnation = self.node_id, self.registration.incarnation

        def plan(image: MetadataImage) -> tuple[list[Record], None]:
            return membership.begin_shutdown(image, node_id, incarnation), None

        started = time.monotonic()
        if prepare is not None:
            await prepare()
        try:
            await self._metadata.change(plan)
        except Exception as e:
            log.warning("controlled shutdown: cannot tell the controller: %s", e)
            return
        self._controller.wake()
        while self._cache.led_by(node_id) and time.monotonic() - started < timeout_s:
            await asyncio.sleep(0.01)
        left = len(self._cache.led_by(node_id))
        if left:
            log.warning(
                "controlled shutdown: %d partitions still led here after %.1f s", left, timeout_s
            )
        else:
            log.info(
                "controlled shutdown: every partition led elsewhere after %.2f s",
                time.monotonic() - started,
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # the rest of the stop goes on
                log.exception("the heartbeat task had failed")
        await self._sender.close()
