"""The listeners a broker serves, built from its configuration: each one's TLS context, SASL
mechanisms and principal rules, ready for the socket server (:class:`Endpoint`).

Everything a listener needs is read and checked here, before the broker binds a port: a key
that does not load or a JAAS config that does not parse fails the start with the property's
name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from automq_py.config import BrokerConfig
from automq_py.network.server import Endpoint
from automq_py.security.config import ListenerSecurity, SaslSettings
from automq_py.security.jaas import parse_jaas_config, plain_users
from automq_py.security.principal import SslPrincipalMapper, distinguished_name
from automq_py.security.sasl_mechanisms import (
    JwksValidator,
    OAuthBearerServer,
    PlainServer,
    SaslMechanismServer,
    ScramCredential,
    ScramServer,
    UnsecuredJwsValidator,
)
from automq_py.security.tls import client_context, server_context
from spark_jobs.controller_client import ClientSecurity
from storage.config_def import ConfigError

# (mechanism, user name) -> the user's SCRAM credential, if any
ScramLookup = Callable[[str, str], ScramCredential | None]


def endpoints(config: BrokerConfig, scram: ScramLookup) -> list[Endpoint]:
    """The listeners to bind (the controller listeners are not: no controller runs here)."""
    controller_names = {
        n.strip().upper()
        for n in config.properties.get("controller.listener.names", "").split(",")
        if n.strip()
    }
    out = []
    for listener in config.listeners:
        if listener.name in controller_names:
            continue
        security = config.security.listener(listener.name)
        out.append(_endpoint(security, listener.host or "0.0.0.0", listener.port, scram))
    return out


def _endpoint(security: ListenerSecurity, host: str, port: int, scram: ScramLookup) -> Endpoint:
    ssl_context = None
    ssl_principal = None
    if security.ssl is not None:
        ssl_context = server_context(security.ssl, security.name)
    if security.ssl is not None and security.sasl is None:
        # the certificate names the principal on SSL listeners only; on SASL_SSL ones SASL
        # does (Kafka's DefaultKafkaPrincipalBuilder maps certificates for SSL alone)
        mapper = SslPrincipalMapper.from_rules(security.ssl.principal_mapping_rules)

        def ssl_principal(cert: Mapping[str, object], mapper: SslPrincipalMapper = mapper) -> str:
            return f"User:{mapper.name(distinguished_name(dict(cert)))}"

    if security.sasl is None:
        return Endpoint(security.name, host, port, ssl_context, ssl_principal=ssl_principal)
    factory = _mechanism_factory(security.name, security.sasl, scram)
    return Endpoint(
        security.name,
        host,
        port,
        ssl_context,
        sasl_mechanisms=security.sasl.enabled_mechanisms,
        new_mechanism=factory,
        ssl_principal=ssl_principal,
        max_reauth_ms=security.sasl.max_reauth_ms,
    )


def _mechanism_factory(
    listener: str, sasl: SaslSettings, scram: ScramLookup
) -> Callable[[str], SaslMechanismServer]:
    """A new server-side exchange of a mechanism the listener enables; each mechanism's
    settings are read once, here."""
    makers: dict[str, Callable[[], SaslMechanismServer]] = {}
    for mechanism in sasl.enabled_mechanisms:
        prop = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
        entries = (
            parse_jaas_config(sasl.jaas.get(mechanism, ""), prop) if mechanism in sasl.jaas else []
        )
        if mechanism == "PLAIN":
            users = plain_users(entries)
            if not users:
                raise ConfigError(
                    f'{prop}: PlainLoginModule names no user (user_<name>="<password>")'
                )
            makers[mechanism] = functools.partial(PlainServer, users)
        elif mechanism.startswith("SCRAM-"):
            lookup = functools.partial(scram, mechanism)
            makers[mechanism] = functools.partial(ScramServer, mechanism, lookup)
        elif mechanism == "OAUTHBEARER":
            if sasl.oauthbearer_jwks_endpoint_url:
                validator: JwksValidator | UnsecuredJwsValidator = JwksValidator(
                    sasl.oauthbearer_jwks_endpoint_url,
                    sasl.oauthbearer_jwks_endpoint_refresh_ms,
                    list(sasl.oauthbearer_expected_audience) or None,
                    sasl.oauthbearer_expected_issuer or None,
                    sub_claim=sasl.oauthbearer_sub_claim_name,
                    scope_claim=sasl.oauthbearer_scope_claim_name,
                    clock_skew_s=sasl.oauthbearer_clock_skew_seconds,
                )
            else:
                options = entries[0].options if entries else {}
                validator = UnsecuredJwsValidator(options)
            makers[mechanism] = functools.partial(OAuthBearerServer, validator)

    def new_server(mechanism: str) -> SaslMechanismServer:
        return makers[mechanism]()

    return new_server


def inter_broker_security(config: BrokerConfig, name: str) -> ClientSecurity | None:
    """How this broker (and its maintenance jobs) connect to listener ``name`` of a broker:
    over TLS with the listener's CAs and its own certificate, authenticating with
    ``sasl.mechanism.inter.broker.protocol`` as the user the listener's JAAS config names for
    it (``username``/``password`` options, as Kafka's brokers read theirs). None: plaintext."""
    listener = config.security.listener(name)
    if listener.protocol == "PLAINTEXT":
        return None
    context = client_context(listener.ssl, name) if listener.ssl is not None else None
    if listener.sasl is None:
        return ClientSecurity(context)
    mechanism = config.security.sasl_mechanism_inter_broker_protocol.upper()
    if mechanism not in listener.sasl.enabled_mechanisms or mechanism == "OAUTHBEARER":
        raise ConfigError(
            f"sasl.mechanism.inter.broker.protocol: {mechanism} for listener {name}; brokers "
            "authenticate to each other with one of its mechanisms "
            f"({', '.join(m for m in listener.sasl.enabled_mechanisms if m != 'OAUTHBEARER')})"
        )
    prop = f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config"
    entries = parse_jaas_config(listener.sasl.jaas.get(mechanism, ""), prop)
    options = entries[0].options if entries else {}
    if not options.get("username") or "password" not in options:
        raise ConfigError(
            f'{prop}: the broker\'s own username="..." password="..." are needed: brokers '
            f"authenticate to each other with {mechanism} on listener {name}"
        )
    return ClientSecurity(context, mechanism, options["username"], options["password"])
