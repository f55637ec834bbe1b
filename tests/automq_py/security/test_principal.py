"""Principals, ssl.principal.mapping.rules (Kafka's SslPrincipalMapperTest cases) and the
RFC 2253 subject names Java's X500Principal gives certificates."""

from __future__ import annotations

import datetime
import re
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from automq_py.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    SslPrincipalMapper,
    distinguished_name,
    parse_principal,
)
from storage.config_def import ConfigError


def test_principal_text() -> None:
    assert str(KafkaPrincipal("User", "alice")) == "User:alice"
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    assert parse_principal("User:alice") == KafkaPrincipal("User", "alice")
    # split at the first colon only; either side may be empty, as Kafka's parser allows
    assert parse_principal("User:CN=a:b") == KafkaPrincipal("User", "CN=a:b")
    assert parse_principal("User:") == KafkaPrincipal("User", "")
    assert parse_principal("User:*") == KafkaPrincipal("User", "*")


@pytest.mark.parametrize("text", ["", "alice", "User"])
def test_malformed_principal(text: str) -> None:
    with pytest.raises(ValueError, match="principalType:principalName"):
        parse_principal(text)


@given(st.text(), st.text())
def test_principal_round_trip(principal_type: str, name: str) -> None:
    if ":" in principal_type:
        return
    principal = KafkaPrincipal(principal_type, name)
    assert parse_principal(str(principal)) == principal


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        "RULE:^CN=(unclosed/$1/",  # a regex that does not compile
    ],
)
def test_invalid_rules(rules: str) -> None:
    prop = "listener.name.ssl.ssl.principal.mapping.rules"
    with pytest.raises(ConfigError, match=f"^{re.escape(prop)}: "):
        SslPrincipalMapper.from_rules(rules, prop)


def test_mapping() -> None:
    mapper = SslPrincipalMapper.from_rules(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    no_cn = "OU=JavaSoft,O=Sun Microsystems,C=US"
    assert mapper.name(no_cn) == no_cn


def test_comma_with_whitespace() -> None:
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


@pytest.mark.parametrize(
    ("expected", "rules"),
    [
        ("[]", ""),
        ("[DEFAULT]", "DEFAULT"),
        ("[RULE:/]", "RULE://"),
        ("[RULE:/.*]", "RULE:/.*/"),
        ("[RULE:/.*/L]", "RULE:/.*/L"),
        ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
        ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
        ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
        ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
        (
            "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
        ),
        # empty rules are ignored
        ("[]", ",   , , ,      , , ,   "),
        ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
        ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
        ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
        # escape sequences
        ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
        ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
        # rules rule
        (
            "[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, "
            "/DEFAULT, DEFAULT]",
            "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
            "/DEFAULT/,DEFAULT",
        ),
    ],
)
def test_rules_splitting(expected: str, rules: str) -> None:
    assert repr(SslPrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_no_rule_matches() -> None:
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/")
    with pytest.raises(ValueError, match="No rules apply to CN=x,OU=Other"):
        mapper.name("CN=x,OU=Other")
    with pytest.raises(ValueError, match="No rules apply"):
        SslPrincipalMapper.from_rules("").name("CN=x")


def test_replacement_as_java_writes_it() -> None:
    # a reference to a group that does not exist is kept as literal text ($3 with 2 groups),
    # $12 with 2 groups is group 1 then "2", and \x is a literal x
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=(\w+),OU=(\w+)$/$1-$3-$12-\$2-$2/")
    assert mapper.name("CN=a,OU=b") == "a-$3-a2-$2-b"
    # a pattern with no group leaves "$1" for Java to fail on: no name, the connection fails
    with pytest.raises(ValueError, match="No group 1"):
        SslPrincipalMapper.from_rules("RULE:^CN=x$/$1/").name("CN=x")


def test_replace_all_after_whole_match() -> None:
    # Java's replaceAll replaces the empty match at the end too, as Python's re.sub does
    assert SslPrincipalMapper.from_rules("RULE:(.*)/[$1]/").name("CN=a") == "[CN=a][]"


def _certificate(tmp_path: Path, name: x509.Name) -> dict[str, object]:
    """``name`` as the subject of a certificate, decoded as getpeercert() decodes one."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    path = tmp_path / "cert.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # the decoder behind SSLSocket.getpeercert()
    decoded: dict[str, object] = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]
    return decoded


def _rdn(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.RelativeDistinguishedName:
    return x509.RelativeDistinguishedName([x509.NameAttribute(o, v) for o, v in attributes])


def test_distinguished_name_of_a_certificate(tmp_path: Path) -> None:
    name = x509.Name(
        [
            _rdn((NameOID.DOMAIN_COMPONENT, "com")),
            _rdn((NameOID.COUNTRY_NAME, "US")),
            _rdn((NameOID.STATE_OR_PROVINCE_NAME, "CA")),
            _rdn((NameOID.LOCALITY_NAME, "SF")),
            _rdn((NameOID.ORGANIZATION_NAME, 'Acme, "Inc" <x>;')),
            _rdn((NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"), (NameOID.USER_ID, "u1")),
            _rdn((NameOID.STREET_ADDRESS, "1 Main")),
            _rdn((NameOID.EMAIL_ADDRESS, "alice@example.com")),
            _rdn((NameOID.COMMON_NAME, " alice+#1=2\\ ")),
        ]
    )
    assert distinguished_name(_certificate(tmp_path, name)) == (
        "CN=\\ alice\\+\\#1\\=2\\\\\\ ,"
        "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,"
        'STREET=1 Main,OU=eng+UID=u1,O=Acme\\, \\"Inc\\" \\<x\\>\\;,L=SF,ST=CA,C=US,DC=com'
    )


def test_attributes_java_has_no_keyword_for(tmp_path: Path) -> None:
    name = x509.Name(
        [
            _rdn((NameOID.SERIAL_NUMBER, "42")),
            _rdn((NameOID.GIVEN_NAME, "Ålice")),
            _rdn((NameOID.COMMON_NAME, "a")),
        ]
    )
    # serialNumber a PrintableString, givenName a UTF8String: both as DER in hex
    assert distinguished_name(_certificate(tmp_path, name)) == (
        "CN=a,2.5.4.42=#0c06c3856c696365,2.5.4.5=#13023432"
    )


def test_long_values_have_long_der_lengths() -> None:
    cert = {"subject": ((("emailAddress", "a" * 200),),)}
    assert distinguished_name(cert) == "1.2.840.113549.1.9.1=#1681c8" + "61" * 200


def test_an_attribute_named_by_its_oid() -> None:
    cert = {"subject": ((("1.2.3.4", "x"),), (("commonName", "a"),))}
    assert distinguished_name(cert) == "CN=a,1.2.3.4=#0c0178"


def test_blank_and_nul_values() -> None:
    cert = {"subject": ((("commonName", "  "),), (("organizationName", "a\0b"),))}
    assert distinguished_name(cert) == "O=a\\00b,CN=\\ \\ "


def test_malformed_subject() -> None:
    with pytest.raises(ValueError):
        distinguished_name({"subject": ((("commonName",),),)})
    with pytest.raises(ValueError):
        distinguished_name({"subject": ((("noSuchAttributeName", "x"),),)})
