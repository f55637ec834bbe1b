"""The session a connection's requests run in: who sends them, from where, through which
listener."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"


@dataclass(slots=True, frozen=True)
class Session:
    """Who sends the requests of a connection: its principal once authenticated (ANONYMOUS
    on PLAINTEXT, or on SSL without a client certificate), its address as ACLs name hosts,
    and the listener it came through (which broker addresses it is told of)."""

    principal: str = ANONYMOUS
    address: str = ""
    listener: str = ""

    @property
    def user(self) -> str:
        """The principal's name, as quotas name users."""
        return self.principal.partition(":")[2]


# the session of the connection whose request is being handled; set by the socket server for
# each connection's task, and again when the connection authenticates (frozen: safe to share)
NO_SESSION = Session()
SESSION: ContextVar[Session] = ContextVar("session", default=NO_SESSION)

# how long the connection whose request is being handled is throttled for (a quota exceeded):
# set by the handler that recorded it, read by the socket server, which then reads nothing
# more from the connection for that long (KIP-219)
THROTTLE_MS: ContextVar[int] = ContextVar("throttle_ms", default=0)
