"""Where the broker's properties come from, before :class:`automq_py.config.BrokerConfig`
reads them: Java ``.properties`` text, ``--override KEY=VALUE``, ``KAFKA_*`` environment
variables named as Kafka's images name them, and AutoMQ's ``--s3-url``, with the S3
credentials AutoMQ takes from its own variables. Every error is a :class:`ConfigError` naming
what was wrong.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qs, quote, unquote, urlsplit

from storage.config_def import ConfigError

log = logging.getLogger("automq.config")

# ``serve --env``: KAFKA_* variables that are not properties (Kafka's scripts and images use
# them for the JVM and themselves).
_NOT_PROPERTIES = frozenset(
    {
        "KAFKA_HEAP_OPTS",
        "KAFKA_OPTS",
        "KAFKA_JVM_PERFORMANCE_OPTS",
        "KAFKA_GC_LOG_OPTS",
        "KAFKA_LOG4J_OPTS",
        "KAFKA_JMX_OPTS",
        "KAFKA_DEBUG",
        "KAFKA_VERSION",
        "KAFKA_HOME",
    }
)
# Variables AutoMQ reads the S3 credentials from, so they stay out of properties files.
ACCESS_KEY_ENV = "KAFKA_S3_ACCESS_KEY"
SECRET_KEY_ENV = "KAFKA_S3_SECRET_KEY"
# what a redacted value shows
HIDDEN = "[hidden]"


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into ``key -> value`` (a repeated key: the last wins).

    Follows ``java.util.Properties.load``: ``#``/``!`` comment lines, ``key=value``,
    ``key: value`` or ``key value``, a line ending in an odd number of backslashes continues
    on the next (whose leading blanks are dropped), and ``\\t \\n \\uXXXX``-style escapes.
    Values are also stripped of trailing blanks, as Kafka trims every value it parses.
    """
    props: dict[str, str] = {}
    for logical in _logical_lines(text):
        key_end = _unescaped_index(logical, "=: \t\f")
        key = logical[:key_end]
        rest = logical[key_end:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(key)] = _unescape(rest).strip()
    return props


def _logical_lines(text: str) -> Iterable[str]:
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending.append(line[:-1])
            continue
        pending.append(line)
        yield "".join(pending)
        pending = []
    if pending:  # a continuation at the end of the file ends the entry, as in Java
        yield "".join(pending)


def _unescaped_index(line: str, stops: str) -> int:
    i = 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        if line[i] in stops:
            return i
        i += 1
    return len(line)


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"malformed \\uxxxx escape in {text!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse_override(text: str) -> tuple[str, str]:
    """Split one ``--override KEY=VALUE`` at its first ``=``; the value may be empty."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--override expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


# AutoMQ's --s3-url parameters (automq-kafka-admin.sh generate-s3-url).
_S3_URL_PARAMS = (
    "s3-access-key",
    "s3-secret-key",
    "s3-region",
    "s3-endpoint-protocol",
    "s3-data-bucket",
    "s3-path-style",
    "s3-ops-bucket",
    "cluster-id",
)


def s3_url_properties(url: str) -> dict[str, str]:
    """The properties AutoMQ's ``--s3-url`` stands for: ``s3.data.buckets`` and ``cluster.id``.

    ``s3://HOST:PORT?s3-access-key=AK&s3-secret-key=SK&s3-region=R&s3-endpoint-protocol=http
    &s3-data-bucket=B&s3-path-style=true&s3-ops-bucket=B&cluster-id=ID`` becomes
    ``s3.data.buckets=0@s3://B?region=R&endpoint=http://HOST:PORT&pathStyle=true&accessKey=AK
    &secretKey=SK``, the url :func:`storage.operator.open_object_store` reads after ``0@``.
    ``s3-ops-bucket`` is not used (automq-py writes no ops data).
    """
    parts = urlsplit(url.strip())
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"--s3-url must be s3://ENDPOINT?s3-data-bucket=..., got {url!r}")
    params: dict[str, str] = {}
    # Split by hand: AutoMQ does not percent-encode, and a secret key may hold a literal '+'
    # that form decoding (parse_qs) would turn into a space.
    for item in filter(None, parts.query.split("&")):
        name, _, value = item.partition("=")
        params[unquote(name)] = unquote(value)
    for name in sorted(set(params) - set(_S3_URL_PARAMS)):
        log.warning("--s3-url parameter %r is not used by automq-py; ignored", name)

    bucket = params.get("s3-data-bucket", "")
    if not bucket:
        raise ConfigError(f"--s3-url: s3-data-bucket is missing in {redact_url(url)!r}")
    protocol = params.get("s3-endpoint-protocol", "https").lower()
    if protocol not in ("http", "https"):
        raise ConfigError(f"--s3-url: s3-endpoint-protocol must be http or https, got {protocol!r}")
    path_style = params.get("s3-path-style", "false").lower()
    if path_style not in ("true", "false"):
        raise ConfigError(f"--s3-url: s3-path-style must be true or false, got {path_style!r}")
    query = {
        "region": params.get("s3-region") or "us-east-1",
        "endpoint": f"{protocol}://{parts.netloc}",
        "pathStyle": path_style,
    }
    access_key, secret_key = params.get("s3-access-key"), params.get("s3-secret-key")
    if access_key and secret_key:
        query["accessKey"], query["secretKey"] = access_key, secret_key
    elif access_key or secret_key:
        raise ConfigError("--s3-url: give both s3-access-key and s3-secret-key, or neither")
    out = {"s3.data.buckets": f"0@s3://{bucket}?{_encode_query(query)}"}
    if params.get("cluster-id"):
        out["cluster.id"] = params["cluster-id"]
    return out


def _encode_query(query: Mapping[str, str]) -> str:
    # Percent-encode everything but the endpoint's ':' and '/', which stay readable; the store
    # decodes with parse_qs, so a '+' in a secret must travel as %2B.
    return "&".join(
        f"{k}={quote(v, safe=':/' if k == 'endpoint' else '')}" for k, v in query.items()
    )


def env_properties(env: Mapping[str, str]) -> dict[str, str]:
    """Properties from ``KAFKA_*`` variables, named as Kafka's images do: the prefix goes, the
    rest is lower-cased, ``___`` becomes ``-``, ``__`` becomes ``_`` and ``_`` becomes ``.``
    (``KAFKA_ADVERTISED_LISTENERS`` -> ``advertised.listeners``, ``KAFKA_S3_WAL_CAPACITY`` ->
    ``s3.wal.capacity``). Variables for the JVM and the S3 credentials are not properties."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if (
            not name.startswith("KAFKA_")
            or name in _NOT_PROPERTIES
            or name in (ACCESS_KEY_ENV, SECRET_KEY_ENV)
        ):
            continue
        key = name[len("KAFKA_") :].lower()
        key = key.replace("___", "\0").replace("__", "\1").replace("_", ".")
        out[key.replace("\0", "-").replace("\1", "_")] = value
    return out


def with_env_credentials(data_url: str, env: Mapping[str, str]) -> str:
    """Add AutoMQ's KAFKA_S3_ACCESS_KEY / KAFKA_S3_SECRET_KEY to an s3:// url without keys."""
    access_key, secret_key = env.get(ACCESS_KEY_ENV), env.get(SECRET_KEY_ENV)
    if not access_key and not secret_key:
        return data_url
    if not (access_key and secret_key):
        missing = SECRET_KEY_ENV if access_key else ACCESS_KEY_ENV
        raise ConfigError(f"{missing} is not set; set both S3 credential variables, or neither")
    store_url = data_url.split("@", 1)[1] if re.match(r"^\d+@", data_url) else data_url
    parts = urlsplit(store_url)
    if parts.scheme != "s3" or "accessKey" in parse_qs(parts.query):
        return data_url  # keys in the url win, as an explicit setting should
    keys = _encode_query({"accessKey": access_key, "secretKey": secret_key})
    return f"{data_url}{'&' if parts.query else '?'}{keys}"


def redact_url(url: str) -> str:
    """``url`` with its secrets hidden: a secret key or password given as a parameter, and the
    password of its user information (``scheme://user:password@host``)."""
    url = re.sub(r"((?:secretKey|s3-secret-key|password)=)[^&]*", r"\1" + HIDDEN, url)
    return re.sub(r"(://[^/@:?&]*:)[^/@?&]*@", r"\1" + HIDDEN + "@", url)
