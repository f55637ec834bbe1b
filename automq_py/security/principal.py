"""Who a connection acts as: Kafka's ``KafkaPrincipal``, and the name a TLS client certificate
gives it through ``ssl.principal.mapping.rules`` (Kafka's ``SslPrincipalMapper``).

The mapping rules are matched against the certificate subject's distinguished name exactly as
Java's ``X500Principal.getName()`` writes it (RFC 2253: most specific RDN first, short keywords
for CN, C, L, ST, O, OU, STREET, DC and UID only, ``OID=#<hex DER>`` for every other attribute),
so rules written for a Kafka broker map the same certificates to the same names here.

=============================  ===========================================================
rule                           effect
=============================  ===========================================================
``DEFAULT``                    the distinguished name itself
``RULE:<regex>/<repl>/``       if ``<regex>`` matches the whole name, every match of it in
                               the name replaced by ``<repl>`` (``$1`` group references,
                               ``\\x`` for a literal ``x``, as Java's ``replaceAll``)
``RULE:<regex>/<repl>/L``      the same, lower-cased (``U``: upper-cased)
=============================  ===========================================================

Rules are comma-separated and tried in order; ``/`` and ``\\`` inside a rule's regex or
replacement are escaped with ``\\``. A name no rule matches refuses the connection.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storage.config_def import ConfigError

USER_TYPE = "User"


@dataclass(slots=True, frozen=True)
class KafkaPrincipal:
    """A principal as Kafka's ACLs name it: ``User:alice``."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


def parse_principal(text: str) -> KafkaPrincipal:
    """``type:name`` split at the first ``:`` (Kafka's ``SecurityUtils.parseKafkaPrincipal``:
    either part may be empty, a name may hold further colons)."""
    principal_type, sep, name = text.partition(":")
    if not text or not sep:
        raise ValueError(f"expected a string in format principalType:principalName but got {text}")
    return KafkaPrincipal(principal_type, name)


# --- ssl.principal.mapping.rules ----------------------------------------------------------

# Java's regex classes, spelt out: Python's \s and . differ from Java's outside ASCII
_JAVA_SPACE = r"[ \t\n\x0b\f\r]"
_JAVA_DOT = "[^\n\r\u0085\u2028\u2029]"
# Kafka's RULE_PATTERN and RULE_SPLITTER, translated
_ESCAPED_OR_PLAIN = rf"(\\{_JAVA_DOT}|[^\\/])*"
_RULE_PATTERN = (
    rf"(DEFAULT)|RULE:({_ESCAPED_OR_PLAIN})/({_ESCAPED_OR_PLAIN})/([LU]?){_JAVA_DOT}*?"
    rf"|({_JAVA_DOT}*?)"
)
_RULE_SPLITTER = re.compile(f"{_JAVA_SPACE}*({_RULE_PATTERN}){_JAVA_SPACE}*(,{_JAVA_SPACE}*|\\Z)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")
_JAVA_INT_MAX = (1 << 31) - 1
# Java's String.trim(): every char up to U+0020
_JAVA_TRIM = "".join(chr(c) for c in range(0x21))


@dataclass(slots=True, frozen=True)
class _Rule:
    """One mapping rule; ``pattern`` None is ``DEFAULT``."""

    pattern: re.Pattern[str] | None
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        groups = self.pattern.groups
        replacement = _escape_literal_back_references(self.replacement, groups)
        result = self.pattern.sub(lambda m: _java_replacement(replacement, m), dn)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        suffix = "/L" if self.to_lower else "/U" if self.to_upper else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}{suffix}"


class SslPrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``: a certificate's distinguished name to a user
    name."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Sequence[_Rule]) -> None:
        self._rules = tuple(rules)

    @classmethod
    def from_rules(
        cls, text: str, property_name: str = "ssl.principal.mapping.rules"
    ) -> SslPrincipalMapper:
        """The mapper for a rules value; a malformed rule (or regex) is a :class:`ConfigError`
        naming ``property_name``."""
        rules: list[_Rule] = []
        for m in _RULE_SPLITTER.finditer(text.strip(_JAVA_TRIM)):
            rule = _parse_rule(m.group(1), property_name)
            if rule is not None:
                rules.append(rule)
        return cls(rules)

    def name(self, distinguished_name: str) -> str:
        """The name the first matching rule gives; ValueError when none matches (Kafka's
        ``NoMatchingRule``: the connection is refused)."""
        for rule in self._rules:
            result = rule.apply(distinguished_name)
            if result is not None:
                return result
        rules = ", ".join(str(r) for r in self._rules)
        raise ValueError(f"No rules apply to {distinguished_name}, rules [{rules}]")

    def __repr__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(str(r) for r in self._rules)}])"


def _parse_rule(rule: str, property_name: str) -> _Rule | None:
    m = _RULE_PARSER.match(rule)
    if m is None:
        raise ConfigError(f"{property_name}: Invalid rule: {rule}")
    if m.end() != len(rule):
        raise ConfigError(
            f"{property_name}: Invalid rule: `{rule}`, unmatched substring: `{rule[m.end() :]}`"
        )
    if m.group(1) is not None:
        return _Rule(None)
    if m.group(2) is None:
        return None  # an empty rule, ignored
    try:
        pattern = re.compile(m.group(2))
    except re.error as e:
        raise ConfigError(f"{property_name}: Invalid rule `{rule}`: {e}") from None
    flag = m.group(6)
    return _Rule(pattern, m.group(4), flag == "L", flag == "U")


def _escape_literal_back_references(unescaped: str, groups: int) -> str:
    """Kafka's ``escapeLiteralBackReferences``: ``$n`` naming no group becomes a literal
    ``$n`` (``$123`` with 12 groups is group 12 then ``3``). Kafka scans the original text
    but edits the copy, so a second escape lands one place early: kept, for the same names."""
    if groups == 0:
        return unescaped
    value = unescaped
    for m in _BACK_REFERENCE.finditer(unescaped):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        if len(digits) > 10 or int(digits) > _JAVA_INT_MAX:
            raise ValueError(f"back reference out of range: ${digits}")
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = m.start(1)
            value = value[: start - 1] + "\\" + value[start - 1 :]
    return value


def _java_replacement(replacement: str, m: re.Match[str]) -> str:
    """``replacement`` expanded for ``m`` as Java's ``Matcher.appendReplacement`` does:
    ``\\x`` is ``x``, ``$n`` the longest group number that exists, ``${name}`` a named group.
    A reference to no group is a ValueError (Java's exception fails the connection too)."""
    out: list[str] = []
    i, n = 0, len(replacement)
    groups = m.re.groups
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("character to be escaped is missing")
            out.append(replacement[i + 1])
            i += 2
        elif c == "$":
            i += 1
            if i >= n:
                raise ValueError("Illegal group reference: group index is missing")
            if replacement[i] == "{":
                end = replacement.find("}", i)
                name = replacement[i + 1 : end] if end > 0 else ""
                if end < 0 or not name or name not in m.re.groupindex:
                    raise ValueError(f"No group with name {{{name}}}")
                out.append(m.group(name) or "")
                i = end + 1
                continue
            if not "0" <= replacement[i] <= "9":
                raise ValueError("Illegal group reference")
            ref = int(replacement[i])
            i += 1
            while i < n and "0" <= replacement[i] <= "9":
                longer = ref * 10 + int(replacement[i])
                if longer > groups:
                    break
                ref = longer
                i += 1
            if ref > groups:
                raise ValueError(f"No group {ref}")
            out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


# --- the subject of a certificate as X500Principal.getName() writes it ---------------------

# OpenSSL's long names (what getpeercert() says) -> Java's RFC 2253 keywords
_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# the attributes Java prints as OID=#hex: their OIDs and the DER string type
# a certificate carries them in (RFC 5280; other strings as UTF8String, OpenSSL's default)
_OIDS = {
    "emailAddress": "1.2.840.113549.1.9.1",
    "serialNumber": "2.5.4.5",
    "surname": "2.5.4.4",
    "title": "2.5.4.12",
    "description": "2.5.4.13",
    "businessCategory": "2.5.4.15",
    "postalCode": "2.5.4.17",
    "name": "2.5.4.41",
    "givenName": "2.5.4.42",
    "initials": "2.5.4.43",
    "generationQualifier": "2.5.4.44",
    "x500UniqueIdentifier": "2.5.4.45",
    "dnQualifier": "2.5.4.46",
    "pseudonym": "2.5.4.65",
    "organizationIdentifier": "2.5.4.97",
    "unstructuredName": "1.2.840.113549.1.9.2",
}
_IA5_STRING, _PRINTABLE_STRING, _UTF8_STRING = 0x16, 0x13, 0x0C
_STRING_TAGS = {
    "emailAddress": _IA5_STRING,
    "unstructuredName": _IA5_STRING,
    "serialNumber": _PRINTABLE_STRING,
    "dnQualifier": _PRINTABLE_STRING,
}
_ESCAPED = set(',=+<>#;"\\')
_OID_TEXT = re.compile(r"[0-9]+(\.[0-9]+)+")


def distinguished_name(peercert: Mapping[str, object]) -> str:
    """The subject of ``peercert`` (as ``ssl.SSLSocket.getpeercert()`` returns it) in RFC 2253
    form as Java's ``X500Principal.getName()`` gives it: ``CN=alice,OU=eng,O=Acme,C=US``.

    Values are escaped as Java escapes them (``, = + < > # ; " \\`` anywhere, NUL as ``\\00``,
    spaces at either end). Attributes Java has no keyword for are ``OID=#<hex DER>``; their
    DER string type is the one RFC 5280 gives them (IA5String for emailAddress,
    PrintableString for serialNumber and dnQualifier, UTF8String otherwise), since
    ``getpeercert()`` no longer tells it.
    """
    subject = peercert.get("subject", ())
    if not isinstance(subject, tuple | list):
        raise ValueError("certificate subject is not a sequence of RDNs")
    rdns: list[str] = []
    for rdn in reversed(subject):
        if not isinstance(rdn, tuple | list):
            raise ValueError(f"malformed RDN in certificate subject: {rdn!r}")
        avas = []
        for ava in rdn:
            if not isinstance(ava, tuple | list) or len(ava) != 2:
                raise ValueError(f"malformed attribute in certificate subject: {ava!r}")
            name, value = ava
            avas.append(_attribute(str(name), str(value)))
        rdns.append("+".join(avas))
    return ",".join(rdns)


def _attribute(name: str, value: str) -> str:
    keyword = _KEYWORDS.get(name)
    if keyword is not None:
        return f"{keyword}={_escape(value)}"
    oid = _oid(name)
    tag = _STRING_TAGS.get(name, _UTF8_STRING)
    content = value.encode("utf-8")
    return f"{oid}=#{_der(tag, content).hex()}"


def _oid(name: str) -> str:
    if _OID_TEXT.fullmatch(name):
        return name
    oid = _OIDS.get(name)
    if oid is not None:
        return oid
    # the names came from OpenSSL: it knows every one of them
    txt2obj: Callable[..., tuple[int, str, str, str]] | None = getattr(ssl, "_txt2obj", None)
    if txt2obj is not None:
        try:
            return txt2obj(name, name=True)[3]
        except ValueError:
            pass
    raise ValueError(f"unknown attribute in certificate subject: {name}")


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    length = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + content


def _escape(value: str) -> str:
    escaped = "".join("\\" + c if c in _ESCAPED else "\\00" if c == "\0" else c for c in value)
    # leading and trailing blanks (space, CR) are escaped too, as Java's AVA does
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    trail = len(escaped) - len(escaped.rstrip(" \r"))
    if lead == len(escaped):
        return "".join("\\" + c for c in escaped)
    head = "".join("\\" + c for c in escaped[:lead])
    tail = "".join("\\" + c for c in escaped[len(escaped) - trail :])
    return head + escaped[lead : len(escaped) - trail] + tail
