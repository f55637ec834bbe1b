"""The failures of authentication, as Kafka's clients expect to be told of them."""

from __future__ import annotations


class SaslAuthenticationError(Exception):
    """The client's credentials were refused (SASL_AUTHENTICATION_FAILED). The message is what
    the client is told: it never says whether the user exists."""


class IllegalSaslStateError(Exception):
    """A SASL message out of turn, or one no mechanism can read (ILLEGAL_SASL_STATE): the
    connection closes."""


class UnsupportedSaslMechanismError(Exception):
    """A mechanism this listener does not enable (UNSUPPORTED_SASL_MECHANISM)."""
