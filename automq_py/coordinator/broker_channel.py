"""Requests transactions need between the brokers of a cluster, over the protocol clients use,
one connection per broker.

The transaction coordinator of a transactional id is the leader of its ``__transaction_state``
partition, and the partitions its transaction writes to may be led by any broker:

* COMMIT or ABORT markers go to those partitions' leaders as WriteTxnMarkers (Kafka's
  ``TransactionMarkerChannelManager``);
* a partition's leader asks the coordinator whether a transactional produce's partition was
  added to the transaction: AddPartitionsToTxn v4 with ``verify_only`` (KIP-890, Kafka's
  ``AddPartitionsToTxnManager``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from automq_py.metadata_cache import ClusterMetadataCache
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from spark_jobs.controller_client import ControllerClient

log = logging.getLogger("automq.broker_channel")

WRITE_TXN_MARKERS_MAX_VERSION = 1
VERIFY_VERSION = 4  # the first AddPartitionsToTxn version brokers send each other
CONNECT_TIMEOUT_S = 10.0


class BrokerChannel:
    def __init__(self, cache: ClusterMetadataCache) -> None:
        self._cache = cache
        self._clients: dict[int, tuple[str, ControllerClient]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def write(
        self,
        leader: int,
        topic: str,
        index: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> ErrorCode:
        """Have broker ``leader`` append the marker to ``topic``-``index``: its error code.
        A connection failure raises (the caller retries, after the leaders may have moved)."""
        client = await self._client(leader)
        body = {
            "markers": [
                {
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "transaction_result": commit,
                    "topics": [{"name": topic, "partition_indexes": [index]}],
                    "coordinator_epoch": coordinator_epoch,
                }
            ]
        }
        try:
            answer = await client.call(
                ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_MAX_VERSION, body
            )
        except BaseException:
            await self._drop(leader)
            raise
        return ErrorCode(int(answer.markers[0].topics[0].partitions[0].error_code))

    async def verify_partitions(
        self,
        coordinator: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:
        """Ask broker ``coordinator`` whether each partition is in the transaction."""
        client = await self._client(coordinator)
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        body = {
            "transactions": [
                {
                    "transactional_id": transactional_id,
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "verify_only": True,
                    "topics": [{"name": t, "partitions": p} for t, p in topics.items()],
                }
            ]
        }
        try:
            answer = await client.call(ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, body)
        except BaseException:
            await self._drop(coordinator)
            raise
        out = dict.fromkeys(partitions, ErrorCode(int(answer.error_code)))
        for txn in answer.results_by_transaction:
            for topic_result in txn.topic_results:
                for p in topic_result.results_by_partition:
                    key = (str(topic_result.name), int(p.partition_index))
                    out[key] = ErrorCode(int(p.partition_error_code))
        return out

    async def _client(self, node_id: int) -> ControllerClient:
        broker = self._cache.broker(node_id)
        if broker is None:
            raise ConnectionError(f"broker {node_id} is not registered")
        address = f"{broker.host}:{broker.port}"
        lock = self._locks.setdefault(node_id, asyncio.Lock())
        async with lock:
            known = self._clients.get(node_id)
            if known is not None and known[0] == address:
                return known[1]
            if known is not None:
                await known[1].close()
            client = await ControllerClient.connect(address, timeout_s=CONNECT_TIMEOUT_S)
            self._clients[node_id] = (address, client)
            return client

    async def _drop(self, node_id: int) -> None:
        known = self._clients.pop(node_id, None)
        if known is not None:
            with contextlib.suppress(Exception):
                await known[1].close()

    async def close(self) -> None:
        for node_id in list(self._clients):
            await self._drop(node_id)
