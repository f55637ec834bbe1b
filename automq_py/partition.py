"""Partition: a topic partition led by this broker, over its ElasticLog.

Produce: the records blob is split into batches, each validated (magic v2, sizes, CRC32C),
copied once into a writable buffer, given its base offset and leader epoch in place (outside
the CRC) and appended. Appends to one partition are serialized, so offsets are assigned in
order; on a single broker the high watermark is the log end offset.

Idempotent producers: under the append lock, before any offset is assigned, the batches are
checked against the log's producer state (:mod:`automq_py.producer_state`). A retried batch
the partition already holds is answered with its original base offset and not appended again;
an out-of-order sequence or a fenced epoch fails the whole request for this partition. The log
records each appended batch in the producer state once it is durable.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from automq_py.log.elastic_log import ElasticLog
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.record_batch import InvalidRecordBatchError, LegacyMessageSetError


@dataclass(slots=True, frozen=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    message: str | None = None


class Partition:
    def __init__(
        self, topic: str, index: int, log: ElasticLog, leader_epoch: int, max_message_bytes: int
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.leader_epoch = leader_epoch
        self.max_message_bytes = max_message_bytes
        self._append_lock = asyncio.Lock()

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    async def append_records(self, records: memoryview) -> AppendResult:
        """Validate and append a Produce request's records for this partition."""
        try:
            batches = list(record_batch.iter_batches(records))
            if not batches:
                raise InvalidRecordBatchError("no record batch in the produce request")
            for header, view in batches:
                if header.size > self.max_message_bytes:
                    return AppendResult(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        message=f"batch of {header.size} bytes exceeds max.message.bytes "
                        f"{self.max_message_bytes}",
                    )
                record_batch.validate_batch(view)
        except LegacyMessageSetError as e:
            return AppendResult(ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, message=str(e))
        except InvalidRecordBatchError as e:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE, message=str(e))
        async with self._append_lock:
            check = self.log.producer_state.check([header for header, _ in batches])
            if check.duplicate is not None:
                return AppendResult(
                    ErrorCode.NONE, check.duplicate.first_offset, self.log.log_start_offset
                )
            if check.error != ErrorCode.NONE:
                return AppendResult(check.error, message=check.message)
            first = -1
            for header, view in batches:
                base = self.log.log_end_offset
                buf = bytearray(view)
                record_batch.assign_offsets(buf, base, self.leader_epoch)
                await self.log.append(
                    memoryview(buf),
                    base_offset=base,
                    record_count=header.last_offset_delta + 1,
                    max_timestamp=header.max_timestamp,
                    first_timestamp=header.base_timestamp,
                )
                if first < 0:
                    first = base
        return AppendResult(ErrorCode.NONE, first, self.log.log_start_offset)

    async def read(self, offset: int, max_bytes: int) -> list[memoryview]:
        return await self.log.read(offset, max_bytes)
