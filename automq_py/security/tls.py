"""TLS for a listener: the server's SSLContext from Kafka's ``ssl.*`` properties.

Keys and certificates come as PEM (``ssl.keystore.type=PEM``: a file holding the private key
and the certificate chain, or the ``ssl.keystore.key`` / ``ssl.keystore.certificate.chain``
texts) or as a PKCS12 file; the CA certificates clients are checked by likewise
(``ssl.truststore.*``). JKS, Java's own format, is refused with a message saying what to use.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from automq_py.security.config import SslSettings
from storage.config_def import ConfigError

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


def server_context(settings: SslSettings, listener: str) -> ssl.SSLContext:
    """The SSLContext serving ``listener``; ConfigError naming the property that is wrong."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = [_VERSIONS.get(v) for v in settings.enabled_protocols]
    if not versions or None in versions:
        raise ConfigError(
            f"ssl.enabled.protocols: {','.join(settings.enabled_protocols)} for listener "
            f"{listener}; use TLSv1.2 and/or TLSv1.3"
        )
    known = [v for v in versions if v is not None]
    ctx.minimum_version = min(known)
    ctx.maximum_version = max(known)
    if settings.cipher_suites:
        try:
            ctx.set_ciphers(":".join(settings.cipher_suites))
        except ssl.SSLError:
            raise ConfigError(
                f"ssl.cipher.suites: no cipher of {','.join(settings.cipher_suites)} is known "
                "to OpenSSL (use OpenSSL's names)"
            ) from None
    _load_keystore(ctx, settings, listener)
    ctx.verify_mode = _CLIENT_AUTH[settings.client_auth]
    if settings.truststore_location or settings.truststore_certificates:
        _load_truststore(ctx, settings, listener)
    elif settings.client_auth != "none":
        raise ConfigError(
            f"ssl.truststore.location: listener {listener} asks clients for certificates "
            f"(ssl.client.auth={settings.client_auth}) and needs the CAs to check them by"
        )
    return ctx


def _load_keystore(ctx: ssl.SSLContext, settings: SslSettings, listener: str) -> None:
    kind = settings.keystore_type.upper()
    password = settings.key_password or None
    if settings.keystore_certificate_chain or settings.keystore_key:
        if not (settings.keystore_certificate_chain and settings.keystore_key):
            raise ConfigError(
                "ssl.keystore.key: set both ssl.keystore.key and ssl.keystore.certificate.chain "
                f"for listener {listener}"
            )
        pem = settings.keystore_key.strip() + "\n" + settings.keystore_certificate_chain.strip()
        with _pem_file(pem + "\n") as path:
            _load_chain(ctx, path, password, "ssl.keystore.key", listener)
        return
    location = settings.keystore_location
    if kind == "PEM":
        _check_file("ssl.keystore.location", location)
        _load_chain(ctx, location, password, "ssl.keystore.location", listener)
    elif kind == "PKCS12":
        _check_file("ssl.keystore.location", location)
        pem = _pkcs12_to_pem(location, settings.keystore_password, "ssl.keystore.location")
        with _pem_file(pem) as path:
            _load_chain(ctx, path, None, "ssl.keystore.location", listener)
    else:
        raise ConfigError(
            f"ssl.keystore.type: {settings.keystore_type} for listener {listener}; automq-py "
            "reads PEM or PKCS12 keystores (convert a JKS one with keytool -importkeystore)"
        )


def _load_truststore(ctx: ssl.SSLContext, settings: SslSettings, listener: str) -> None:
    try:
        if settings.truststore_certificates:
            ctx.load_verify_locations(cadata=settings.truststore_certificates)
            return
        location = settings.truststore_location
        _check_file("ssl.truststore.location", location)
        kind = settings.truststore_type.upper()
        if kind == "PEM":
            ctx.load_verify_locations(cafile=location)
        elif kind == "PKCS12":
            from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

            data = Path(location).read_bytes()
            password = settings.truststore_password.encode() or None
            store = pkcs12.load_pkcs12(data, password)
            certs = [c.certificate for c in store.additional_certs]
            if store.cert is not None:
                certs.append(store.cert.certificate)
            ctx.load_verify_locations(
                cadata="".join(c.public_bytes(Encoding.PEM).decode() for c in certs)
            )
        else:
            raise ConfigError(
                f"ssl.truststore.type: {settings.truststore_type} for listener {listener}; "
                "automq-py reads PEM or PKCS12 truststores"
            )
    except (ssl.SSLError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(
            f"ssl.truststore.location: no CA certificate could be read for listener {listener}: {e}"
        ) from None


def _load_chain(
    ctx: ssl.SSLContext, path: str, password: str | None, prop: str, listener: str
) -> None:
    try:
        ctx.load_cert_chain(path, password=password)
    except ssl.SSLError as e:
        hint = " (is ssl.key.password right?)" if "BAD_DECRYPT" in str(e) or password else ""
        raise ConfigError(
            f"{prop}: the key and certificate chain of listener {listener} could not be read: "
            f"{e.reason or e}{hint}"
        ) from None


def _check_file(prop: str, location: str) -> None:
    if not location:
        raise ConfigError(f"{prop}: not set")
    if not os.path.isfile(location):
        raise ConfigError(f"{prop}: {location} is not a file")


def _pkcs12_to_pem(location: str, password: str, prop: str) -> str:
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        pkcs12,
    )

    try:
        store = pkcs12.load_pkcs12(Path(location).read_bytes(), password.encode() or None)
    except ValueError as e:
        raise ConfigError(f"{prop}: cannot read the PKCS12 keystore {location}: {e}") from None
    if store.key is None or store.cert is None:
        raise ConfigError(f"{prop}: the PKCS12 keystore {location} holds no key and certificate")
    key = store.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    chain = [store.cert.certificate, *(c.certificate for c in store.additional_certs)]
    return key.decode() + "".join(c.public_bytes(Encoding.PEM).decode() for c in chain)


@contextmanager
def _pem_file(text: str) -> Iterator[str]:
    """``text`` in a file only this user can read, for as long as OpenSSL loads it."""
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield path
    finally:
        os.unlink(path)


def client_context(settings: SslSettings, listener: str) -> ssl.SSLContext:
    """The SSLContext a broker connects to another's ``listener`` with: the listener's CAs to
    check the other broker by (and its host name, as Kafka's default
    ``ssl.endpoint.identification.algorithm=https`` does), its own key and certificate to
    present if the other asks for one."""
    if not (settings.truststore_location or settings.truststore_certificates):
        raise ConfigError(
            f"ssl.truststore.location: brokers connect to each other on listener {listener} "
            "and need the CAs to check each other by"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # (checks the host name and certificate)
    _load_truststore(ctx, settings, listener)
    _load_keystore(ctx, settings, listener)
    return ctx
