"""AccessControl: the broker's ACLs, kept in the metadata store and checked on every request.

ACL bindings are KV pairs (``acl/<hash>``, :func:`automq_py.security.acls.binding_key`), so a
cluster's brokers all follow the same ones: each reloads its :class:`StandardAuthorizer` when
a change touches that prefix, its own or another broker's. The principal and host checked
are the session's of the connection being served (:data:`automq_py.apis.context.SESSION`).
With no ``authorizer.class.name`` everything is allowed and the ACL APIs answer
SECURITY_DISABLED, as Kafka does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from automq_py.security.acls import (
    ACL_KV_PREFIX,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    ResourceType,
    binding_key,
    decode_binding,
    encode_binding,
)
from automq_py.security.authorizer import StandardAuthorizer
from automq_py.security.config import SecurityConfig
from automq_py.security.session import SESSION
from storage.metadata import records as rec
from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager

log = logging.getLogger("automq.security")


class AccessControl:
    def __init__(self, config: SecurityConfig, metadata: MetadataManager) -> None:
        self.enabled = config.authorizer_enabled
        self._metadata = metadata
        self.authorizer = StandardAuthorizer(
            config.super_user_set(), config.allow_everyone_if_no_acl_found
        )
        self._reload()
        metadata.add_kv_listener(ACL_KV_PREFIX, self._reload)

    def authorize(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """Whether the session being served may do ``operation`` on the resource."""
        if not self.enabled:
            return True
        session = SESSION.get()
        return self.authorizer.authorize(
            session.principal, session.address, operation, resource_type, name
        )

    def authorize_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether the session may do ``operation`` on some resource of the type (KIP-679)."""
        if not self.enabled:
            return True
        session = SESSION.get()
        return self.authorizer.authorize_by_resource_type(
            session.principal, session.address, operation, resource_type
        )

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """The ``*_authorized_operations`` bit field of the resource for the session."""
        session = SESSION.get()
        return self.authorizer.authorized_operations(
            session.principal, session.address, resource_type, name
        )

    async def create(self, bindings: Sequence[AclBinding]) -> None:
        """Store ``bindings`` (one change: all or none)."""

        def plan(image: MetadataImage) -> tuple[list[rec.Record], None]:
            out: list[rec.Record] = []
            for b in bindings:
                key = binding_key(b)
                if key not in image.kv:
                    out.append(rec.KVRecord(key, encode_binding(b)))
            return out, None

        await self._metadata.change(plan)

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[list[AclBinding]]:
        """Drop the bindings each filter matches; each filter's matches (one change)."""

        def plan(image: MetadataImage) -> tuple[list[rec.Record], list[list[AclBinding]]]:
            stored = _stored(image)
            matched = [[b for b in stored.values() if f.matches(b)] for f in filters]
            keys = {binding_key(b) for found in matched for b in found}
            return [rec.RemoveKV(k) for k in sorted(keys)], matched

        return await self._metadata.change(plan)

    def _reload(self) -> None:
        self.authorizer.load(_stored(self._metadata.image).values())


def _stored(image: MetadataImage) -> dict[str, AclBinding]:
    out = {}
    for key, value in image.kv.items():
        if key.startswith(ACL_KV_PREFIX):
            try:
                out[key] = decode_binding(value)
            except ValueError as e:
                log.warning("ACL %s ignored: %s", key, e)
    return out
