"""The security settings: each listener's protocol, TLS and SASL settings, the authorizer's.

Kafka's names throughout. A listener's TLS and SASL properties may be set for it alone with
the ``listener.name.<listener>.`` prefix (``listener.name.sasl_ssl.ssl.keystore.location``,
``listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config``), which wins over the unprefixed
property; a SASL mechanism's JAAS config is read from
``listener.name.<listener>.<mechanism>.sasl.jaas.config``, then from the listener's
``sasl.jaas.config``, then from the unprefixed ``sasl.jaas.config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from storage.config_def import (
    ConfigError,
    ConfigKey,
    ConfigType,
    config_field,
    declared_keys,
    parse_declared,
)

# what automq-py can authenticate with; Kafka's default (GSSAPI) needs Kerberos
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
# the switch that turns authorisation on: Kafka's class names (ZooKeeper's and KRaft's)
AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)
LISTENER_PREFIX = "listener.name."


def _prop(name: str, default: Any, type: ConfigType, doc: str, **kw: Any) -> Any:
    return config_field(name, default, type, doc, **kw)


@dataclass(slots=True, frozen=True)
class SslSettings:
    """One listener's TLS properties (PEM files, as Kafka's ``ssl.keystore.type=PEM``)."""

    keystore_type: str = _prop(
        "ssl.keystore.type", "JKS", ConfigType.STRING, "PEM or PKCS12 (JKS is Java's own)"
    )
    keystore_location: str = _prop(
        "ssl.keystore.location", "", ConfigType.STRING, "the server's key and certificate chain"
    )
    keystore_password: str = _prop(
        "ssl.keystore.password", "", ConfigType.STRING, "the PKCS12 keystore's password"
    )
    key_password: str = _prop(
        "ssl.key.password", "", ConfigType.STRING, "the password of an encrypted private key"
    )
    keystore_certificate_chain: str = _prop(
        "ssl.keystore.certificate.chain", "", ConfigType.STRING, "the certificate chain, PEM"
    )
    keystore_key: str = _prop("ssl.keystore.key", "", ConfigType.STRING, "the private key, PEM")
    truststore_type: str = _prop("ssl.truststore.type", "JKS", ConfigType.STRING, "PEM or PKCS12")
    truststore_location: str = _prop(
        "ssl.truststore.location", "", ConfigType.STRING, "CA certificates clients are checked by"
    )
    truststore_password: str = _prop(
        "ssl.truststore.password", "", ConfigType.STRING, "the PKCS12 truststore's password"
    )
    truststore_certificates: str = _prop(
        "ssl.truststore.certificates", "", ConfigType.STRING, "CA certificates, PEM"
    )
    client_auth: str = _prop(
        "ssl.client.auth",
        "none",
        ConfigType.STRING,
        "whether clients present a certificate: none, requested or required",
        choices=("none", "requested", "required"),
    )
    enabled_protocols: tuple[str, ...] = _prop(
        "ssl.enabled.protocols",
        ("TLSv1.2", "TLSv1.3"),
        ConfigType.LIST,
        "TLS versions accepted",
    )
    cipher_suites: tuple[str, ...] = _prop(
        "ssl.cipher.suites",
        (),
        ConfigType.LIST,
        "cipher suites (OpenSSL names); empty: the default",
    )
    principal_mapping_rules: str = _prop(
        "ssl.principal.mapping.rules",
        "DEFAULT",
        ConfigType.STRING,
        "rules mapping a client certificate's distinguished name to a principal name",
    )


@dataclass(slots=True, frozen=True)
class SaslSettings:
    """One listener's SASL properties."""

    enabled_mechanisms: tuple[str, ...] = _prop(
        "sasl.enabled.mechanisms",
        ("GSSAPI",),
        ConfigType.LIST,
        "SASL mechanisms clients may use: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER",
    )
    oauthbearer_jwks_endpoint_url: str = _prop(
        "sasl.oauthbearer.jwks.endpoint.url",
        "",
        ConfigType.STRING,
        "where OAUTHBEARER tokens' signing keys are read; empty: unsecured tokens (tests only)",
    )
    oauthbearer_jwks_endpoint_refresh_ms: int = _prop(
        "sasl.oauthbearer.jwks.endpoint.refresh.ms",
        3_600_000,
        ConfigType.LONG,
        "how often the signing keys are read again",
        minimum=0,
    )
    oauthbearer_expected_audience: tuple[str, ...] = _prop(
        "sasl.oauthbearer.expected.audience", (), ConfigType.LIST, "audiences a token must name"
    )
    oauthbearer_expected_issuer: str = _prop(
        "sasl.oauthbearer.expected.issuer", "", ConfigType.STRING, "the issuer a token must name"
    )
    oauthbearer_sub_claim_name: str = _prop(
        "sasl.oauthbearer.sub.claim.name", "sub", ConfigType.STRING, "the claim naming the user"
    )
    oauthbearer_scope_claim_name: str = _prop(
        "sasl.oauthbearer.scope.claim.name", "scope", ConfigType.STRING, "the scope claim"
    )
    oauthbearer_clock_skew_seconds: int = _prop(
        "sasl.oauthbearer.clock.skew.seconds",
        30,
        ConfigType.INT,
        "clock difference allowed with the token's issuer",
        minimum=0,
    )
    # mechanism -> the JAAS config text its login module is configured with
    jaas: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # mechanism -> its connections.max.reauth.ms where the listener or the mechanism sets one
    # (listener.name.<l>.<mechanism>.connections.max.reauth.ms, then
    # listener.name.<l>.connections.max.reauth.ms); the others take the broker's
    max_reauth_ms: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(slots=True, frozen=True)
class ListenerSecurity:
    """What a listener asks of the clients connecting to it."""

    name: str
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    ssl: SslSettings | None = None
    sasl: SaslSettings | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


@dataclass(slots=True, frozen=True)
class SecurityConfig:
    """The broker-wide security properties, and each listener's."""

    authorizer_class_name: str = _prop(
        "authorizer.class.name",
        "",
        ConfigType.STRING,
        "turns ACL authorisation on: org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    )
    super_users: str = _prop(
        "super.users",
        "",
        ConfigType.STRING,
        "principals allowed everything, separated by ';' (User:admin;User:broker)",
    )
    allow_everyone_if_no_acl_found: bool = _prop(
        "allow.everyone.if.no.acl.found",
        False,
        ConfigType.BOOLEAN,
        "allow what no ACL names a resource for (with an authorizer on)",
    )
    connections_max_reauth_ms: int = _prop(
        "connections.max.reauth.ms",
        0,
        ConfigType.LONG,
        "SASL sessions must re-authenticate this often (KIP-368); 0: never",
        minimum=0,
    )
    connection_failed_authentication_delay_ms: int = _prop(
        "connection.failed.authentication.delay.ms",
        100,
        ConfigType.INT,
        "how long a failed authentication's answer and close are delayed",
        minimum=0,
    )
    sasl_server_max_receive_size: int = _prop(
        "sasl.server.max.receive.size",
        524_288,
        ConfigType.INT,
        "largest request read before a client has authenticated",
        minimum=1,
    )
    inter_broker_listener_name: str = _prop(
        "inter.broker.listener.name",
        "",
        ConfigType.STRING,
        "the listener brokers reach each other on (default: by security.inter.broker.protocol)",
    )
    security_inter_broker_protocol: str = _prop(
        "security.inter.broker.protocol",
        "PLAINTEXT",
        ConfigType.STRING,
        "the protocol of the inter-broker listener, if inter.broker.listener.name is unset",
    )
    sasl_mechanism_inter_broker_protocol: str = _prop(
        "sasl.mechanism.inter.broker.protocol",
        "GSSAPI",
        ConfigType.STRING,
        "the SASL mechanism brokers authenticate to each other with",
    )
    quota_window_num: int = _prop(
        "quota.window.num",
        11,
        ConfigType.INT,
        "samples a client's rate is measured over",
        minimum=1,
    )
    quota_window_size_seconds: int = _prop(
        "quota.window.size.seconds",
        1,
        ConfigType.INT,
        "the length of each sample of a client's rate",
        minimum=1,
    )
    controller_quota_window_num: int = _prop(
        "controller.quota.window.num",
        11,
        ConfigType.INT,
        "samples a client's rate of topic and partition changes is measured over: with"
        " controller.quota.window.size.seconds, how many seconds of its"
        " controller_mutation_rate a client may use in one burst",
        minimum=1,
    )
    controller_quota_window_size_seconds: int = _prop(
        "controller.quota.window.size.seconds",
        1,
        ConfigType.INT,
        "the length of each sample of a client's rate of topic and partition changes",
        minimum=1,
    )
    listeners: Mapping[str, ListenerSecurity] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    @property
    def authorizer_enabled(self) -> bool:
        return bool(self.authorizer_class_name)

    def super_user_set(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.super_users.split(";") if u.strip())

    def listener(self, name: str) -> ListenerSecurity:
        return self.listeners.get(name) or ListenerSecurity(name, "PLAINTEXT")

    def inter_broker_listener(self, names: list[str]) -> str:
        """The listener other brokers connect to, of this broker's ``names`` (in order)."""
        if self.inter_broker_listener_name:
            return self.inter_broker_listener_name.upper()
        for name in names:
            if self.listener(name).protocol == self.security_inter_broker_protocol.upper():
                return name
        return names[0]

    @staticmethod
    def keys() -> dict[str, ConfigKey]:
        """Every unprefixed property read here, by name."""
        out = {name: key for name, (_, key) in declared_keys(SecurityConfig).items()}
        out.update((name, key) for name, (_, key) in declared_keys(SslSettings).items())
        out.update((name, key) for name, (_, key) in declared_keys(SaslSettings).items())
        out["sasl.jaas.config"] = ConfigKey(
            "sasl.jaas.config", ConfigType.STRING, None, "a SASL mechanism's login module"
        )
        return out

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], protocols: Mapping[str, str]
    ) -> SecurityConfig:
        """Build from the properties; ``protocols``: each listener's security protocol."""
        values = parse_declared(cls, props)
        listeners = {
            name: _listener_security(name, protocol, props) for name, protocol in protocols.items()
        }
        config = cls(listeners=MappingProxyType(listeners), **values)
        if config.authorizer_class_name and config.authorizer_class_name not in AUTHORIZER_CLASSES:
            raise ConfigError(
                f"authorizer.class.name: {config.authorizer_class_name!r} is not an authorizer "
                f"automq-py has; use {AUTHORIZER_CLASSES[0]} (ACLs in the metadata store)"
            )
        inter_broker = config.inter_broker_listener_name.upper()
        if inter_broker and inter_broker not in protocols:
            raise ConfigError(
                f"inter.broker.listener.name: {config.inter_broker_listener_name} names no "
                "listener in listeners"
            )
        return config


def listener_properties(props: Mapping[str, str], listener: str) -> dict[str, str]:
    """The properties as ``listener`` sees them: its ``listener.name.<listener>.`` ones over
    the unprefixed ones."""
    prefix = f"{LISTENER_PREFIX}{listener.lower()}."
    out = {k: v for k, v in props.items() if not k.startswith(LISTENER_PREFIX)}
    out.update((k[len(prefix) :], v) for k, v in props.items() if k.startswith(prefix))
    return out


def _reauth_ms(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"{key}: {raw!r} is not a number of milliseconds (0: sessions never re-authenticate)"
        )
    return value


def _listener_security(name: str, protocol: str, props: Mapping[str, str]) -> ListenerSecurity:
    mine = listener_properties(props, name)
    ssl = None
    sasl = None
    if protocol in ("SSL", "SASL_SSL"):
        settings = dict(mine)
        if protocol == "SASL_SSL":
            # as Kafka's ChannelBuilders: a SASL_SSL listener asks clients for certificates
            # only where its own listener.name.<listener>.ssl.client.auth says so (SASL
            # authenticates them), never for the unprefixed ssl.client.auth of SSL listeners
            own = props.get(f"{LISTENER_PREFIX}{name.lower()}.ssl.client.auth")
            settings["ssl.client.auth"] = own if own is not None else "none"
        ssl = SslSettings(**parse_declared(SslSettings, settings))
        if not ssl.keystore_location and not ssl.keystore_certificate_chain:
            raise ConfigError(
                f"ssl.keystore.location: listener {name} uses {protocol} and needs the server's "
                f"key and certificate (set ssl.keystore.location, or "
                f"listener.name.{name.lower()}.ssl.keystore.location)"
            )
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        values = parse_declared(SaslSettings, mine)
        mechanisms = tuple(m.upper() for m in values.get("enabled_mechanisms", ("GSSAPI",)))
        unknown = [m for m in mechanisms if m not in SASL_MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError(
                f"sasl.enabled.mechanisms: listener {name} enables {','.join(mechanisms)}; "
                f"automq-py authenticates with {', '.join(SASL_MECHANISMS)} (set "
                f"sasl.enabled.mechanisms, or listener.name.{name.lower()}.sasl.enabled.mechanisms)"
            )
        values["enabled_mechanisms"] = mechanisms
        jaas = {}
        for mechanism in mechanisms:
            text = mine.get(f"{mechanism.lower()}.sasl.jaas.config") or mine.get("sasl.jaas.config")
            if text:
                jaas[mechanism] = text
            elif mechanism == "PLAIN":
                raise ConfigError(
                    f"listener.name.{name.lower()}.plain.sasl.jaas.config: listener {name} "
                    "enables PLAIN and needs its users (PlainLoginModule with user_<name>="
                    '"<password>" options)'
                )
        reauth: dict[str, int] = {}
        prefix = f"{LISTENER_PREFIX}{name.lower()}."
        for mechanism in mechanisms:
            own = f"{mechanism.lower()}.connections.max.reauth.ms"
            # the mechanism's (listener-prefixed or not), then the listener's: the broker's
            # own connections.max.reauth.ms, which may change dynamically, is not copied here
            for key in (prefix + own, own, prefix + "connections.max.reauth.ms"):
                raw = props.get(key)
                if raw is None:
                    continue
                reauth[mechanism] = _reauth_ms(key, raw)
                break
        sasl = SaslSettings(
            jaas=MappingProxyType(jaas), max_reauth_ms=MappingProxyType(reauth), **values
        )
    return ListenerSecurity(name, protocol, ssl, sasl)
