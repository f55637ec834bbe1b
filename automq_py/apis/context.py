"""What every API handler may use: this broker's identity, the topics, the partitions."""

from __future__ import annotations

import logging
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from automq_py.config import BrokerConfig
from automq_py.coordinator.group_configs import GroupConfigs
from automq_py.coordinator.group_coordinator import OFFSETS_TOPIC, GroupCoordinator
from automq_py.coordinator.transaction_coordinator import TransactionCoordinator
from automq_py.dynamic_config import DynamicBrokerConfig
from automq_py.metadata_cache import NO_LEADER, ClusterMetadataCache, Leadership
from automq_py.partition import Partition
from automq_py.replica_manager import ReplicaManager
from automq_py.security.access import AccessControl
from automq_py.security.acls import CLUSTER_NAME, AclOperation, ResourceType, supported_operations
from automq_py.security.quotas import ClientQuotas
from automq_py.security.session import SESSION
from automq_py.topic_config import ConfigLayers
from automq_py.topics import (
    INTERNAL_TOPICS,
    TopicError,
    TopicInfo,
    TopicRegistry,
    check_collision,
)
from protocol import build
from protocol.errors import ErrorCode
from protocol.fetch import NodeEndpoint
from protocol.messages import EncodedBody, Request, response_schema

log = logging.getLogger("automq.apis")

# the address of the client whose request is being handled ("/127.0.0.1", as Kafka shows it);
# the socket server sets it for each connection's task
CLIENT_HOST: ContextVar[str] = ContextVar("client_host", default="")


class CloseConnection(Exception):
    """A request no response can answer (a failed acks=0 Produce): the connection is closed,
    as Kafka closes it, so that the client learns of the failure."""


@dataclass(slots=True)
class BrokerContext:
    node_id: int
    cluster_id: str
    host: str  # advertised, on the first listener
    port: int
    topics: TopicRegistry
    replicas: ReplicaManager
    auto_create_topics: bool
    num_partitions: int
    # the whole configuration, for DescribeConfigs of the broker resource
    config: BrokerConfig = field(default_factory=BrokerConfig)
    groups: GroupCoordinator | None = None
    transactions: TransactionCoordinator | None = None
    # the dynamic broker configs (AlterConfigs on a broker resource), once the broker runs
    dynamic_config: DynamicBrokerConfig | None = None
    # consumer groups' own configs (AlterConfigs on a group resource), once the broker runs
    group_configs: GroupConfigs | None = None
    # ACLs and the authorizer (None: everything is allowed)
    access: AccessControl | None = None
    # client quotas (None: none are enforced)
    quotas: ClientQuotas | None = None
    # each listener's advertised address (a client is told of the brokers on its listener)
    advertised: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Metadata responses already encoded, for requests asking the same of the same state
    metadata_responses: dict[tuple[Any, ...], EncodedBody] = field(default_factory=dict)

    def config_layers(self) -> ConfigLayers:
        """Where the broker's properties come from, for DescribeConfigs."""
        if self.dynamic_config is None:
            return ConfigLayers.of(self.config)
        return self.dynamic_config.layers()

    @property
    def cluster(self) -> ClusterMetadataCache | None:
        """What this broker knows of its cluster; None for a single broker."""
        return self.replicas.cluster

    def leadership(self, topic: str, index: int) -> Leadership:
        """Who leads the partition, at which leader epoch. A single broker leads every one at
        the node epoch its logs were opened at (it grows with each start, as a new leadership
        would)."""
        cluster = self.cluster
        if cluster is None:
            return Leadership(self.node_id, self.replicas.storage.node_epoch)
        return cluster.leadership(topic, index)

    @property
    def broker_ids(self) -> frozenset[int]:
        """The registered brokers, which a manual replica assignment may name."""
        cluster = self.cluster
        if cluster is None:
            return frozenset({self.node_id})
        return frozenset(b.node_id for b in cluster.live_brokers())

    @property
    def controller_id(self) -> int:
        """The controller clients are told of: the elected one while it is live, otherwise
        this broker. Any broker carries out the admin requests clients send the controller (as
        a KRaft broker forwards them, and tells clients of a live broker, never of none): a
        client told of no controller holds those requests until its next metadata refresh."""
        cluster = self.cluster
        if cluster is None:
            return self.node_id
        elected = cluster.controller_id()
        registration = cluster.broker(elected)
        if registration is None or registration.fenced:
            return self.node_id
        return elected

    @property
    def secured(self) -> bool:
        """Whether an authorizer judges the session's requests (with none, all are allowed)."""
        access = self.access
        return access is not None and access.enabled

    def allowed(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """Whether the session being served may do ``operation`` on the resource (always,
        with no authorizer)."""
        access = self.access
        return (
            access is None or not access.enabled or access.authorize(operation, resource_type, name)
        )

    def allowed_on_cluster(self, operation: AclOperation) -> bool:
        """Whether the session may do ``operation`` on the cluster resource."""
        return self.allowed(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def allowed_on_some(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether the session may do ``operation`` on some resource of the type (KIP-679)."""
        access = self.access
        return (
            access is None or not access.enabled or access.authorize_any(operation, resource_type)
        )

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """The ``*_authorized_operations`` bit field of a resource for the session being
        served: with no authorizer every operation the resource type has, as Kafka's
        AuthHelper answers."""
        access = self.access
        if access is None or not access.enabled:
            bits = 0
            for operation in supported_operations(resource_type):
                bits |= 1 << operation
            return bits
        return access.authorized_operations(resource_type, name)

    def cluster_authorized_operations(self) -> int:
        """The cluster's bit field for Metadata v8-v10 and DescribeCluster: 0 without
        DESCRIBE on the cluster, as Kafka answers."""
        if not self.allowed_on_cluster(AclOperation.DESCRIBE):
            return 0
        return self.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)

    def own_address(self) -> tuple[str, int]:
        """Where the client being served reaches this broker: on its listener's advertised
        address."""
        return self.advertised.get(SESSION.get().listener, (self.host, self.port))

    def broker_entries(self) -> list[dict[str, object]]:
        """The brokers clients may connect to (Metadata's and DescribeCluster's list), at
        their addresses on the listener the client came through; a broker without that
        listener is left out, as Kafka does."""
        cluster = self.cluster
        if cluster is None:
            host, port = self.own_address()
            return [{"node_id": self.node_id, "host": host, "port": port, "rack": None}]
        listener = SESSION.get().listener
        out: list[dict[str, object]] = []
        for b in cluster.live_brokers():
            endpoint = b.endpoint(listener)
            if endpoint is not None:
                out.append(
                    {"node_id": b.node_id, "host": endpoint[0], "port": endpoint[1], "rack": b.rack}
                )
        return out

    def leader_hint(self, topic: str, index: int) -> tuple[int, int] | None:
        """KIP-951: the (leader, leader epoch) a response names for a partition this broker
        could not serve as its leader (Fetch v16+, Produce v10+), so the client goes there
        without asking Metadata first; None when it has no live leader."""
        leadership = self.leadership(topic, index)
        return None if leadership.leader == NO_LEADER else (leadership.leader, leadership.epoch)

    def node_endpoints(self, node_ids: Collection[int]) -> list[NodeEndpoint]:
        """The addresses of brokers ``node_ids`` on the client's listener, for the leaders a
        response names (KIP-951)."""
        # (a broker entry's keys are NodeEndpoint's fields: node_id, host, port, rack)
        entries = self.broker_entries()
        return [NodeEndpoint(**b) for b in entries if b["node_id"] in node_ids]  # type: ignore[arg-type]

    def broker_entry(self, node_id: int) -> dict[str, object] | None:
        """How to reach broker ``node_id`` (None: not a live broker)."""
        return next((b for b in self.broker_entries() if b["node_id"] == node_id), None)

    def open_partitions(self, topic: str) -> list[Partition]:
        """The partitions of ``topic`` opened so far, to apply a config change to; the others
        read the topic's configs when they open."""
        return self.replicas.opened(topic)

    async def topic_for_write(
        self, name: str, auto_create: bool
    ) -> tuple[TopicInfo | None, ErrorCode]:
        """The topic, auto-created when allowed; else the error to answer with."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic, ErrorCode.NONE
        if not (auto_create and self.auto_create_topics):
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if name in INTERNAL_TOPICS:
            # made by its coordinator, with its partitions and configs (Kafka's
            # AutoTopicCreationManager asks for offsets.topic.num.partitions, compaction, ...)
            return await self._create_internal(name)
        try:
            check_collision(name, (t.name for t in self.topics.all()))
        except TopicError:
            # refused by Kafka's controller, which the Metadata answer does not wait for
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        try:
            created = await self.topics.create(name, self.num_partitions)
            self.replicas.open_in_background(created)
            return created, ErrorCode.NONE
        except TopicError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self.topics.get(name), ErrorCode.NONE
            return None, ErrorCode(e.code)

    async def _create_internal(self, name: str) -> tuple[TopicInfo | None, ErrorCode]:
        coordinator = self.groups if name == OFFSETS_TOPIC else self.transactions
        if coordinator is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        try:
            return await coordinator.runtime.topic(), ErrorCode.NONE
        except Exception as e:
            log.warning("cannot create %s: %s", name, e)
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def respond(request: Request, data: dict[str, Any]) -> Any:
    """The response to ``request`` at its version, built from ``data`` (plain values)."""
    return build.build(response_schema(request.api_key, request.api_version), data)
