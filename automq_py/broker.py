"""The broker process: S3Storage, topics, partitions, KafkaApis and the socket server.

``run(config)`` serves until SIGTERM/SIGINT, then shuts down gracefully: the listener closes,
partitions close (MetaStreams record a clean shutdown) and the stream store uploads what its
cache holds and trims the WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from automq_py.apis import KafkaApis
from automq_py.apis.context import BrokerContext
from automq_py.apis.producer import producer_id_manager
from automq_py.config import BrokerConfig, ConfigError
from automq_py.coordinator.group_configs import GroupConfigs
from automq_py.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from automq_py.coordinator.transaction_coordinator import (
    TransactionConfig,
    TransactionCoordinator,
)
from automq_py.dynamic_config import DynamicBrokerConfig
from automq_py.loop_lag import CollectorPauses, LoopLagMonitor, collector_paused
from automq_py.maintenance import Maintenance
from automq_py.metadata_cache import ClusterMetadataCache
from automq_py.metrics.collector import BrokerMetrics
from automq_py.metrics.http import MetricsServer
from automq_py.network.listeners import endpoints as listener_endpoints
from automq_py.network.listeners import inter_broker_security
from automq_py.network.server import AuthenticationSettings, SocketServer, write_ready_responses
from automq_py.replica_manager import ReplicaManager
from automq_py.security import scram_credentials
from automq_py.security.access import AccessControl
from automq_py.security.quotas import ClientQuotas
from automq_py.security.sasl_mechanisms import ScramCredential
from automq_py.topics import TopicRegistry
from spark_jobs.controller_client import ControllerClient
from storage import loop_cpu
from storage.loop_cpu import LoopCpu
from storage.metadata import control
from storage.s3_storage import S3Storage

if TYPE_CHECKING:
    from automq_py.broker_lifecycle import BrokerLifecycle
    from automq_py.controller.cluster_controller import ClusterController

log = logging.getLogger("automq.broker")

# how long a broker of a cluster stopping on SIGTERM waits for its partitions to be led
# elsewhere (within docker stop's default grace of 10 s)
CONTROLLED_SHUTDOWN_TIMEOUT_S = 6.0
# before that, how long the partitions' tails may take to upload while they are still served
# (what is left then is uploaded as each closes)
TAILS_UPLOAD_TIMEOUT_S = 2.0


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.storage: S3Storage | None = None
        self.replicas: ReplicaManager | None = None
        self.server: SocketServer | None = None
        self.groups: GroupCoordinator | None = None
        self.transactions: TransactionCoordinator | None = None
        self.maintenance: Maintenance | None = None
        self.loop_lag = LoopLagMonitor()
        self.collector_pauses = CollectorPauses(freeze_survivors=True)
        self._settling: asyncio.Task[None] | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.controller: ClusterController | None = None
        self.metrics_server: MetricsServer | None = None
        # why the broker does not serve (yet, or any more); None while it does
        self._not_ready: str | None = "starting: recovering the WAL"

    async def start(self) -> None:
        self.loop_lag.start()
        self.collector_pauses.start()
        try:
            self._start_metrics_server()
            await self._start()
        except BaseException:
            # a broker that failed to start is never stopped: take its monitors back
            if self.metrics_server is not None:
                await self.metrics_server.stop()
            self.collector_pauses.stop()
            await self.loop_lag.stop()
            raise
        self._not_ready = None

    def readiness(self) -> str | None:
        """None while the broker serves, else why not (``/readyz``)."""
        if self._not_ready is not None:
            return self._not_ready
        failed = None if self.storage is None else self.storage.failed
        if failed is not None:  # every append is refused until a restart recovers the WAL
            return f"storage failed: {failed}"
        lifecycle = self.lifecycle
        if lifecycle is not None and lifecycle.fenced:
            return "fenced by the controller: registering again"
        return None

    def _start_metrics_server(self) -> None:
        """Before the WAL's recovery, so that probes hear "not ready" meanwhile."""
        config = self.config
        if config.metrics_port < 0:
            return
        host = config.metrics_host or config.listeners[0].host
        try:
            self.metrics_server = MetricsServer(
                host,
                config.metrics_port,
                BrokerMetrics(self, partition_series=config.metrics_partition_series_enable),
                self.readiness,
                lambda: self.loop_lag.last_tick,
            )
        except OSError as e:
            raise ConfigError(
                f"metrics.port: cannot listen on {host}:{config.metrics_port}: {e}"
            ) from e
        self.metrics_server.start()

    async def _start(self) -> None:
        config = self.config
        group_config = GroupConfig.from_broker(config)  # a bad setting fails before any I/O
        transaction_config = TransactionConfig.from_broker(config)
        # keys, certificates and JAAS configs are read now: a bad one fails before any I/O
        endpoints = listener_endpoints(config, self._scram_credential)
        inter_broker_name = config.security.inter_broker_listener([e.name for e in endpoints])
        _check_inter_broker_listener(config, inter_broker_name)
        # how this process (the broker channel, the in-process maintenance jobs) reaches brokers
        ControllerClient.default_security = inter_broker_security(config, inter_broker_name)
        self.storage = await S3Storage.start(config.storage)
        self._not_ready = "starting: loading partitions, groups and transactions"
        metadata = self.storage.metadata
        cache: ClusterMetadataCache | None = None
        if config.cluster_mode:
            # imported here: a single broker needs none of the cluster's modules (nor asyncpg)
            from automq_py.controller.topic_placement import ClusterTopicPlacement

            # the WAL is recovered into objects: whoever leads this broker's former partitions
            # now may take them over
            node_id, node_epoch = config.node_id, self.storage.node_epoch
            await metadata.change(
                lambda image: (control.close_node_streams(image, node_id, node_epoch), None)
            )
            cache = ClusterMetadataCache(config.node_id, metadata)
            topics = TopicRegistry(metadata, ClusterTopicPlacement(cache))
        else:
            topics = TopicRegistry(metadata)
        dynamic_config = DynamicBrokerConfig(config, self.storage.metadata)
        try:
            topic_defaults = dynamic_config.topic_defaults()
        except ConfigError as e:
            # stored before a change of the properties made it invalid: Kafka skips it too
            log.warning("dynamic broker configs ignored: %s", e)
            topic_defaults = config.topic_defaults()
        self.replicas = ReplicaManager(self.storage, topic_defaults, cluster=cache)
        self.replicas.set_producer_id_expiration_ms(dynamic_config.producer_id_expiration_ms())
        self.replicas.expire_producers_every(config.producer_id_expiration_check_interval_ms / 1000)
        dynamic_config.add_listener(lambda: self._dynamic_config_changed(dynamic_config, topics))
        # a topic's configs altered through another broker reach its partitions open here
        topics.add_config_listener(self.replicas.apply_config)
        advertised = config.advertised_listeners[0]
        addresses = {a.name: (a.host, a.port) for a in config.advertised_listeners}
        ctx = BrokerContext(
            node_id=config.node_id,
            cluster_id=config.cluster_id,
            host=advertised.host,
            port=advertised.port,
            advertised=addresses,
            access=AccessControl(config.security, metadata),
            quotas=ClientQuotas(
                metadata,
                config.security.quota_window_num,
                config.security.quota_window_size_seconds,
                mutation_burst_s=config.security.controller_quota_window_num
                * config.security.controller_quota_window_size_seconds,
            ),
            topics=topics,
            replicas=self.replicas,
            auto_create_topics=config.auto_create_topics_enable,
            num_partitions=config.num_partitions,
            config=config,
            dynamic_config=dynamic_config,
            group_configs=GroupConfigs(config, self.storage.metadata),
        )
        # finish deleting the logs of topics deleted before a crash
        self.replicas.destroy_deleted_in_background(lambda i: topics.by_id(i) is not None)
        self.groups = GroupCoordinator(group_config, topics, self.replicas)
        ctx.groups = self.groups
        await self.groups.start()
        self.transactions = TransactionCoordinator(
            transaction_config,
            topics,
            self.replicas,
            self.groups,
            producer_id_manager(ctx).generate,
            coordinator_epoch=self.storage.node_epoch,
        )
        ctx.transactions = self.transactions
        await self.transactions.start()
        if cache is not None:
            cache.add_leaders_listener(self.replicas.leaders_changed)
            cache.add_leaders_listener(self.groups.runtime.leaders_changed)
            cache.add_leaders_listener(self.transactions.runtime.leaders_changed)
            self.replicas.open_on_leadership(topics.get)
        apis = KafkaApis(ctx)
        security = config.security
        self.server = SocketServer(
            apis,
            max_request_size=config.socket_request_max_bytes,
            send_buffer_bytes=config.socket_send_buffer_bytes,
            receive_buffer_bytes=config.socket_receive_buffer_bytes,
            idle_timeout_s=config.connections_max_idle_ms / 1000,
            authentication=AuthenticationSettings(
                security.connections_max_reauth_ms,
                security.connection_failed_authentication_delay_ms,
                security.sasl_server_max_receive_size,
            ),
            request_phases=self.metrics_server is not None,
        )
        # Produce responses go out as their WAL commit's acknowledgements end, together
        self.storage.wal.after_acknowledgements.append(write_ready_responses)
        self.server.on_idle = self.storage.commit_now
        self.server.between_requests = self.storage.wal.acknowledge_completed
        _settle_garbage_collector()  # startup's objects, before a client can wait behind them
        await self.server.start_listeners(endpoints)
        # brokers (and the maintenance jobs) reach this one on the inter-broker listener
        inter_broker = security.inter_broker_listener([e.name for e in endpoints])
        bound = next((e for e in endpoints if e.name == inter_broker), endpoints[0])
        inter_broker = bound.name
        own_host = bound.host if bound.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if bound.ssl is not None:  # (the host name the certificate names)
            own_host = addresses.get(inter_broker, (own_host, 0))[0]
        if cache is not None:
            host, port = addresses.get(inter_broker, (advertised.host, advertised.port))
            await self._join_cluster(cache, host, port)
        controller = self.controller
        self.maintenance = Maintenance(
            config,
            f"{own_host}:{self.server.listener_port(inter_broker)}",
            cluster_wide=None if controller is None else lambda: controller.active,
            cleaner_backoff_ms=dynamic_config.cleaner_backoff_ms,
        )
        self.maintenance.start()
        self._settling = asyncio.create_task(self._settle(apis), name="settle")
        log.info(
            "automq-py broker %d of cluster %s serving on %s:%d",
            config.node_id,
            config.cluster_id,
            advertised.host,
            advertised.port,
        )

    def _dynamic_config_changed(self, dynamic: DynamicBrokerConfig, topics: TopicRegistry) -> None:
        """The stored dynamic configs changed (here, or through another broker): the open
        partitions take the topic defaults and ``producer.id.expiration.ms`` now in effect."""
        assert self.replicas is not None
        self.replicas.set_producer_id_expiration_ms(dynamic.producer_id_expiration_ms())
        try:
            defaults = dynamic.topic_defaults()
        except ConfigError as e:
            log.warning("dynamic broker configs ignored: %s", e)
            return
        if defaults != self.replicas.topic_defaults:
            self.replicas.topic_defaults = defaults
            for topic in topics.all():
                self.replicas.apply_config(topic)

    async def _join_cluster(self, cache: ClusterMetadataCache, host: str, port: int) -> None:
        """Register, start heartbeats and the controller role (see :mod:`broker_lifecycle`)."""
        from automq_py.broker_lifecycle import BrokerLifecycle
        from automq_py.controller.cluster_controller import ClusterController
        from automq_py.controller.cluster_records import BrokerRegistration

        config = self.config
        assert self.storage is not None
        url = config.storage.metadata_url
        self.controller = ClusterController(
            config.node_id,
            url,
            self.storage.metadata,
            cache,
            config.broker_heartbeat_interval_ms,
            config.broker_session_timeout_ms,
            rebalance=config.auto_leader_rebalance_enable,
            recover_wal=(
                self.storage.recover_node_wal
                if config.storage.wal_object_store_url is not None
                else None
            ),
        )
        registration = BrokerRegistration(
            config.node_id,
            self.storage.node_epoch,
            host,
            port,
            config.broker_rack or None,
            endpoints=tuple((a.name, a.host, a.port) for a in config.advertised_listeners),
        )
        self.storage.rejoins_when_fenced = True
        self.lifecycle = BrokerLifecycle(
            registration,
            url,
            self.storage,
            cache,
            self.controller,
            config.broker_heartbeat_interval_ms,
            config.broker_session_timeout_ms,
        )
        await self.lifecycle.register()
        assert self.replicas is not None
        self.replicas.session = self.lifecycle
        self.controller.start()

    def _scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        """A user's SCRAM credential, as the metadata store holds it now."""
        if self.storage is None:
            return None
        return scram_credentials.lookup(self.storage.metadata.image.kv, mechanism, user)

    async def stop(self) -> None:
        # a stop builds and drops per-partition state by the thousand (final metas, uploads,
        # metadata changes) and its young collections free nothing: the exit comes first
        with collector_paused():
            await self._stop()

    async def _stop(self) -> None:
        self._not_ready = "stopping"
        if self.lifecycle is not None:
            # partitions and their coordinators move away while this broker still serves
            replicas = self.replicas
            await self.lifecycle.controlled_shutdown(
                CONTROLLED_SHUTDOWN_TIMEOUT_S,
                None if replicas is None else lambda: replicas.upload_tails(TAILS_UPLOAD_TIMEOUT_S),
            )
            if replicas is not None:
                # heartbeats go on meanwhile: fenced halfway, it could commit none of the rest
                await replicas.handed_over()
        if self.controller is not None:
            await self.controller.stop()
        if self.lifecycle is not None:
            await self.lifecycle.stop()
            if self.storage is not None:
                # no registering again now: uploads waiting for it give up, and what they held
                # stays in the WAL for the next start
                self.storage.rejoins_when_fenced = False
        if self._settling is not None:
            self._settling.cancel()
        if self.maintenance is not None:
            await self.maintenance.stop()
        if self.transactions is not None:
            await self.transactions.stop()
        if self.groups is not None:
            await self.groups.stop()
        if self.server is not None:
            await self.server.stop()
            for line in self.server.metrics.summary():
                log.info("%s", line)
        if self.replicas is not None:
            await self.replicas.close()
        if self.storage is not None:
            await self.storage.close()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.loop_lag.stop()
        log.info("%s", self.loop_lag.summary())
        self.collector_pauses.stop()
        log.info("%s", self.collector_pauses.summary())
        log.info("broker stopped")

    async def _settle(self, apis: KafkaApis) -> None:
        """Right after startup: load the hot APIs' schemas, then settle the collector."""
        try:
            loaded = await apis.warm_up()
        except Exception:  # a cost saved, not a function: serving goes on regardless
            log.exception("loading the request schemas failed")
            return
        log.debug("loaded %d request/response schema versions", loaded)
        _settle_garbage_collector()


def _check_inter_broker_listener(config: BrokerConfig, name: str) -> None:
    """Spark's executors reach the broker as plain clients: refuse an inter-broker listener
    asking for TLS or SASL where they would, and warn where an authorizer would refuse the
    principal the other brokers and the jobs connect as."""
    security = config.security
    listener = security.listener(name)
    runner = config.storage.maintenance_runner
    if listener.protocol != "PLAINTEXT" and runner in ("spark", "auto"):
        raise ConfigError(
            f"inter.broker.listener.name: listener {name} ({listener.protocol}) asks for TLS or "
            f"SASL, which the maintenance jobs' Spark executors cannot give (s3.maintenance."
            f"runner={runner}); set s3.maintenance.runner=local, or name a PLAINTEXT listener "
            "on a private address in inter.broker.listener.name"
        )
    if not config.cluster_mode and runner == "none":
        return
    anonymous = listener.protocol == "PLAINTEXT"
    if (
        anonymous
        and security.authorizer_enabled
        and "User:ANONYMOUS" not in security.super_user_set()
    ):
        log.warning(
            "brokers and the maintenance jobs connect to listener %s as User:ANONYMOUS, which "
            "is not in super.users: the authorizer refuses their requests unless ACLs allow "
            "them (CLUSTER_ACTION on the cluster)",
            name,
        )


def _settle_garbage_collector() -> None:
    """Move what startup built (modules, schemas, the metadata image) out of the cyclic
    collector's reach, so a full collection no longer walks it: on a 2-core machine that walk
    paused the event loop for 25-80 ms, and every produce waited behind it. Called before the
    listener opens, and again once the request schemas are loaded (the second walk is short:
    frozen objects are skipped). Objects made from here on are collected as usual; frozen ones
    are still freed by reference counting."""
    gc.collect()
    gc.freeze()
    # fewer, larger young collections: each request allocates hundreds of short-lived objects
    gc.set_threshold(10_000, 20, 20)
    log.debug("garbage collector: %d startup objects frozen", gc.get_freeze_count())


async def run(config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    # the thread pool's threads run on every CPU, whichever the event loop's thread is on
    loop.set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="asyncio", initializer=loop_cpu.widen_thread)
    )
    await broker.start()
    pinned = LoopCpu()
    if config.event_loop_pin_cpu:
        pinned.start()
    try:
        await stop.wait()
    finally:
        pinned.stop()
        await broker.stop()
