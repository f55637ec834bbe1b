"""InitProducerId (22): producer ids for idempotent producers.

Producer ids come from blocks reserved in the metadata KV under :data:`PRODUCER_ID_BLOCK_KEY`
(an 8-byte big-endian long: the first id no block has taken yet), as Kafka's controller hands
out ``ProducerIdsRecord`` blocks. A block is reserved durably before any of its ids is given
out, so a restart skips the rest of the block and never issues an id twice.

* ``transactional_id`` null: a new id, epoch 0, also when the producer gives its current id and
  epoch (KIP-360, v3+), as Kafka's coordinator answers an idempotent producer resetting its
  sequences.
* a current producer id without its epoch, or an epoch without its id: INVALID_REQUEST.
* a ``transactional_id``: the transaction coordinator decides
  (:meth:`~automq_py.coordinator.transaction_coordinator.TransactionCoordinator.init_producer_id`:
  a new id, or the id's epoch bumped, which fences the previous producer and aborts its open
  transaction).

Authorization is Kafka's: a transactional id needs WRITE on it (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent producer IDEMPOTENT_WRITE on the cluster
or, per KIP-679, WRITE on some topic (else CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import weakref
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.coordinator import transaction_metadata as tm
from automq_py.security.acls import AclOperation, ResourceType
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.records import KVRecord, Record

log = logging.getLogger("automq.producer")

PRODUCER_ID_BLOCK_KEY = "producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000
_LONG = struct.Struct(">q")


class ProducerIdManager:
    """Hands out producer ids from blocks reserved durably in the metadata KV."""

    def __init__(self, metadata: MetadataManager, block_size: int = PRODUCER_ID_BLOCK_SIZE):
        self.metadata = metadata
        self.block_size = block_size
        self._next = 0
        self._block_end = 0  # ids in [_next, _block_end) are reserved and unused
        self._lock = asyncio.Lock()

    async def generate(self) -> int:
        """A producer id never issued before (reserving a new block when needed)."""
        async with self._lock:
            if self._next >= self._block_end:
                size = self.block_size

                def reserve(image: MetadataImage) -> tuple[list[Record], int]:
                    # read from the image the change is checked against: brokers sharing the
                    # metadata each get their own block
                    raw = image.kv.get(PRODUCER_ID_BLOCK_KEY)
                    first = 0 if raw is None else int(_LONG.unpack(raw)[0])
                    return [KVRecord(PRODUCER_ID_BLOCK_KEY, _LONG.pack(first + size))], first

                # durable before use: after a crash the next block starts past this one
                start = await self.metadata.change(reserve)
                self._next, self._block_end = start, start + size
                log.info("reserved producer ids [%d, %d)", start, self._block_end)
            producer_id = self._next
            self._next += 1
            return producer_id


# one manager per metadata store: the handler has only the broker context to find it by
_managers: weakref.WeakKeyDictionary[MetadataManager, ProducerIdManager] = (
    weakref.WeakKeyDictionary()
)


def producer_id_manager(ctx: BrokerContext) -> ProducerIdManager:
    """The broker's producer id manager."""
    metadata = ctx.replicas.storage.metadata
    manager = _managers.get(metadata)
    if manager is None:
        manager = _managers[metadata] = ProducerIdManager(metadata)
    return manager


def _refusal(ctx: BrokerContext, transactional_id: str | None) -> ErrorCode:
    """The error of an InitProducerId the session may not make, else NONE."""
    if transactional_id is not None:
        if ctx.allowed(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return ErrorCode.NONE
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if ctx.allowed_on_cluster(AclOperation.IDEMPOTENT_WRITE) or ctx.allowed_on_some(
        AclOperation.WRITE, ResourceType.TOPIC
    ):
        return ErrorCode.NONE
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


async def handle_init_producer_id(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    error, producer_id, producer_epoch = ErrorCode.NONE, -1, -1
    transactional_id = None if body.transactional_id is None else str(body.transactional_id)
    refused = _refusal(ctx, transactional_id)
    current_id = int(getattr(body, "producer_id", -1))
    current_epoch = int(getattr(body, "producer_epoch", -1))
    if refused != ErrorCode.NONE:
        error = refused
    elif (current_id == -1) != (current_epoch == -1):
        # as Kafka's KafkaApis: a current producer id without its epoch, or the other way
        error = ErrorCode.INVALID_REQUEST
    elif transactional_id is not None:
        assert ctx.transactions is not None, "the broker starts its coordinators before serving"
        timeout = body.transaction_timeout
        timeout_ms = (
            int(timeout.total_seconds() * 1000)
            if hasattr(timeout, "total_seconds")
            else int(timeout)
        )
        error, producer_id, producer_epoch = await ctx.transactions.init_producer_id(
            transactional_id,
            timeout_ms,
            current_id,
            current_epoch,
        )
        error = tm.error_for_version(ApiKey.INIT_PRODUCER_ID, request.api_version, error)
    else:
        # as Kafka's TransactionCoordinator: a new id at epoch 0 whatever the request says of
        # the producer's current one (KIP-360's v3+ fields are read only with a transactional id)
        producer_id, producer_epoch = await producer_id_manager(ctx).generate(), 0
    return build.build(
        response_schema(ApiKey.INIT_PRODUCER_ID, request.api_version),
        {
            "throttle_time": 0,
            "error_code": error,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
        },
    )


# v6 adds two-phase commit (KIP-939), which needs transactions: 0..5 as Kafka 4.0 has.
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.INIT_PRODUCER_ID: (handle_init_producer_id, 0, 5),
}
