"""Coordinator records (``__transaction_state``'s, and a KIP-848 member's of
``__consumer_offsets``) encoded and decoded by kafka-python 3's schema-driven codec.

An independent implementation of Kafka's message-schema rules (compact strings and arrays,
nullable arrays, tagged fields) fed the schemas in this directory; ``encode(header=True)`` puts
the int16 version first, as Kafka's ``MessageUtil.toVersionPrefixedBytes`` does.
"""

from __future__ import annotations

import sys

from kafka.protocol.api_data import ApiData  # type: ignore[import-untyped]

_HERE = sys.modules[__name__]


class TransactionLogKey(ApiData, load_json=_HERE):  # type: ignore[call-arg]
    pass


class TransactionLogValue(ApiData, load_json=_HERE):  # type: ignore[call-arg]
    pass


class ConsumerGroupMemberMetadataValue(ApiData, load_json=_HERE):  # type: ignore[call-arg]
    pass


class ConsumerGroupCurrentMemberAssignmentValue(ApiData, load_json=_HERE):  # type: ignore[call-arg]
    pass
