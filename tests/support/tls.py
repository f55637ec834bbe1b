"""Certificates for TLS tests: a CA, the broker's key and certificate, a client's, and a
client certificate from a CA the broker does not trust, as PEM files in a directory."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD = "key-secret"


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA both sides trust
    server: Path  # the broker's private key (encrypted with KEY_PASSWORD) and certificate chain
    client_cert: Path  # a client's certificate (subject CN=alice,OU=clients,O=automq-py)
    client_key: Path
    rogue_cert: Path  # a client certificate from a CA the broker does not trust
    rogue_key: Path
    rogue_ca: Path


def _name(cn: str, ou: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "automq-py")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    subject: x509.Name,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("automq-py test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, _name("localhost", "brokers"), server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, _name("alice", "clients"), server=False)
    rogue_ca_key, rogue_ca_cert = _ca("someone else's CA")
    rogue_key, rogue_cert = _leaf(rogue_ca_key, rogue_ca_cert, _name("mallory"), server=False)
    out = Certificates(
        ca=directory / "ca.pem",
        server=directory / "server.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        rogue_cert=directory / "rogue.pem",
        rogue_key=directory / "rogue-key.pem",
        rogue_ca=directory / "rogue-ca.pem",
    )
    out.ca.write_bytes(_pem(ca_cert))
    out.server.write_bytes(_key_pem(server_key, KEY_PASSWORD) + _pem(server_cert) + _pem(ca_cert))
    out.client_cert.write_bytes(_pem(client_cert))
    out.client_key.write_bytes(_key_pem(client_key))
    out.rogue_cert.write_bytes(_pem(rogue_cert))
    out.rogue_key.write_bytes(_key_pem(rogue_key))
    out.rogue_ca.write_bytes(_pem(rogue_ca_cert))
    return out
