"""ReplicaManager: the partitions this broker leads, opened lazily over S3Storage, and the
signal that wakes long-polling fetches when data arrives."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from automq_py.log.elastic_log import ElasticLog
from automq_py.log.log_config import LogConfig
from automq_py.partition import Partition
from automq_py.topic_config import effective_topic_config
from automq_py.topics import TopicInfo
from storage.s3_storage import S3Storage
from storage.stream import StreamClient

log = logging.getLogger("automq.replica")


class ReplicaManager:
    def __init__(self, storage: S3Storage, topic_defaults: dict[str, str]) -> None:
        self.storage = storage
        self.client = StreamClient(storage)
        self.topic_defaults = topic_defaults
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}
        self._data_arrived = asyncio.Event()

    def log_config(self, topic: TopicInfo) -> LogConfig:
        return effective_topic_config(self.topic_defaults, topic.configs).log_config

    async def partition(self, topic: TopicInfo, index: int) -> Partition:
        """The partition, opening its ElasticLog (creating it on first use) if needed."""
        key = (topic.name, index)
        found = self._partitions.get(key)
        if found is not None:
            return found
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            found = self._partitions.get(key)
            if found is not None:
                return found
            config = self.log_config(topic)
            # every broker start opens with a newer node epoch, fencing any older owner
            epoch = self.storage.node_epoch
            elastic_log = await ElasticLog.open(
                self.client,
                self.storage.metadata,
                self.storage.config.namespace,
                str(topic.topic_id),
                index,
                epoch,
                config,
            )
            partition = Partition(topic.name, index, elastic_log, epoch, config.max_message_bytes)
            self._partitions[key] = partition
            log.info("opened partition %s-%d at epoch %d", topic.name, index, epoch)
            return partition

    def notify_data(self) -> None:
        """Wake every fetch waiting for data."""
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()

    async def wait_for_data(self, timeout: float) -> None:
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._data_arrived.wait(), timeout)

    async def close_topic(self, name: str) -> None:
        for key in [k for k in self._partitions if k[0] == name]:
            partition = self._partitions.pop(key)
            await partition.log.close()

    async def close(self) -> None:
        for partition in list(self._partitions.values()):
            try:
                await partition.log.close()
            except Exception as e:
                log.warning("closing %s-%d: %s", partition.topic, partition.index, e)
        self._partitions.clear()
