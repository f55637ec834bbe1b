"""What every API handler may use: this broker's identity, the topics, the partitions."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from automq_py.config import BrokerConfig
from automq_py.coordinator.group_configs import GroupConfigs
from automq_py.coordinator.group_coordinator import GroupCoordinator
from automq_py.coordinator.transaction_coordinator import TransactionCoordinator
from automq_py.dynamic_config import DynamicBrokerConfig
from automq_py.partition import Partition
from automq_py.replica_manager import ReplicaManager
from automq_py.topic_config import ConfigLayers
from automq_py.topics import TopicError, TopicInfo, TopicRegistry
from protocol import build
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

# the address of the client whose request is being handled ("/127.0.0.1", as Kafka shows it);
# the socket server sets it for each connection's task
CLIENT_HOST: ContextVar[str] = ContextVar("client_host", default="")


@dataclass(slots=True)
class BrokerContext:
    node_id: int
    cluster_id: str
    host: str  # advertised
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

    def config_layers(self) -> ConfigLayers:
        """Where the broker's properties come from, for DescribeConfigs."""
        if self.dynamic_config is None:
            return ConfigLayers.of(self.config)
        return self.dynamic_config.layers()

    @property
    def leader_epoch(self) -> int:
        """Every partition's leader epoch: the node epoch its logs were opened at (it grows
        with each broker start, as a new leadership would)."""
        return self.replicas.storage.node_epoch

    @property
    def broker_ids(self) -> frozenset[int]:
        """The registered brokers, which a manual replica assignment may name: this broker is
        the whole cluster."""
        return frozenset({self.node_id})

    def broker_entry(self) -> dict[str, object]:
        return {"node_id": self.node_id, "host": self.host, "port": self.port, "rack": None}

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
        try:
            created = await self.topics.create(name, self.num_partitions)
            self.replicas.open_in_background(created)
            return created, ErrorCode.NONE
        except TopicError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self.topics.get(name), ErrorCode.NONE
            return None, ErrorCode(e.code)


def respond(request: Request, data: dict[str, Any]) -> Any:
    """The response to ``request`` at its version, built from ``data`` (plain values)."""
    return build.build(response_schema(request.api_key, request.api_version), data)
