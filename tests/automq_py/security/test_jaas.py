"""sasl.jaas.config values, read as Kafka's JaasConfig (StreamTokenizer) reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.security.jaas import (
    PLAIN_LOGIN_MODULE,
    LoginModuleEntry,
    parse_jaas_config,
    plain_users,
)
from storage.config_def import ConfigError

PROP = "listener.name.sasl_plaintext.plain.sasl.jaas.config"


def parse(text: str) -> list[LoginModuleEntry]:
    return parse_jaas_config(text, PROP)


def test_one_module() -> None:
    [entry] = parse(
        f'{PLAIN_LOGIN_MODULE} required username="admin" password="admin-secret" '
        'user_admin="admin-secret" user_alice="alice-secret";'
    )
    assert entry == LoginModuleEntry(
        PLAIN_LOGIN_MODULE,
        "required",
        {
            "username": "admin",
            "password": "admin-secret",
            "user_admin": "admin-secret",
            "user_alice": "alice-secret",
        },
    )


def test_several_modules_flags_and_unquoted_values() -> None:
    entries = parse(
        "test.LoginModuleA REQUIRED a=1 b=two;\n"
        "  test.LoginModuleB Requisite;\ttest.LoginModuleC sufficient c='x y' ;"
        "test.LoginModuleD optional d=$1;"
    )
    assert [(e.module, e.flag, e.options) for e in entries] == [
        ("test.LoginModuleA", "required", {"a": "1", "b": "two"}),
        ("test.LoginModuleB", "requisite", {}),
        ("test.LoginModuleC", "sufficient", {"c": "x y"}),
        ("test.LoginModuleD", "optional", {"d": "$1"}),
    ]


def test_quoted_values_and_escapes() -> None:
    [entry] = parse(
        r"""m required a="x\"y" b='it\'s' c="a\\b" d="tab\there" e="\101\60\0x" f="q=;/"
        g="\z" h="\477" i = "spaced" j="";"""
    )
    assert entry.options == {
        "a": 'x"y',
        "b": "it's",
        "c": "a\\b",
        "d": "tab\there",
        "e": "A0\0x",
        "f": "q=;/",
        "g": "z",
        "h": "\x277",  # a first digit over 3 takes two digits only
        "i": "spaced",
        "j": "",
    }


def test_comments() -> None:
    entries = parse(
        "// the PLAIN users\n"
        "m required /* inline */ a=1 // to the end of the line\n"
        "  b=2 / a lone slash comments out the rest of the line too\n"
        ";"
    )
    assert entries == [LoginModuleEntry("m", "required", {"a": "1", "b": "2"})]


def test_later_duplicate_option_wins() -> None:
    assert parse("m required a=1 a=2;")[0].options == {"a": "2"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Login module not specified in JAAS config"),
        ("   // only a comment", "Login module not specified in JAAS config"),
        ("m", "Login module control flag not specified in JAAS config"),
        ("m =", "Login module control flag is not available in the JAAS config"),
        ("m mandatory;", "Invalid login module control flag 'mandatory' in JAAS config"),
        ("m required a=1", "JAAS config entry not terminated by semi-colon"),
        ("m required a;", "Value not specified for key 'a' in JAAS config"),
        ("m required a b;", "Value not specified for key 'a' in JAAS config"),
        ("m required a=;", "Value not specified for key 'a' in JAAS config"),
        ("m required a=", "Value not specified for key 'a' in JAAS config"),
        ("m required =1;", "Option name expected"),
        ("; m required;", "Login module name not specified"),
        ('m required a="unterminated;', "Unterminated quoted string"),
        ('m required a="line\nend";', "Unterminated quoted string"),
    ],
)
def test_malformed(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{PROP}: .*{message}"):
        parse(text)


def test_plain_users() -> None:
    entries = parse(
        f"{PLAIN_LOGIN_MODULE} required username=admin password=pw user_admin=pw user_bob=b1 "
        "user_=nobody;"
        "other.Module required user_eve=e;"
        f"{PLAIN_LOGIN_MODULE} required user_bob=b2 user_carol=c;"
    )
    # only PlainLoginModule's options; the first entry naming a user wins, as Kafka looks
    assert plain_users(entries) == {"admin": "pw", "bob": "b1", "carol": "c"}


_WORD = st.text(
    alphabet=st.characters(
        exclude_categories=["Cs"],
        exclude_characters="\"';=/",
        min_codepoint=0x21,
    ).filter(lambda c: not 0x81 <= ord(c) <= 0x9F),
    min_size=1,
    max_size=12,
)


@given(
    st.lists(
        st.tuples(
            _WORD,
            st.sampled_from(["required", "requisite", "sufficient", "optional"]),
            st.dictionaries(_WORD, st.text(max_size=20), max_size=4),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_written_configs_read_back(modules: list[tuple[str, str, dict[str, str]]]) -> None:
    def quote(value: str) -> str:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r") + '"'

    text = " ".join(
        f"{module} {flag} " + " ".join(f"{k}={quote(v)}" for k, v in options.items()) + ";"
        for module, flag, options in modules
    )
    assert parse(text) == [LoginModuleEntry(m, f, o) for m, f, o in modules]


@given(st.text(max_size=80))
def test_any_text_parses_or_is_a_config_error(text: str) -> None:
    try:
        entries = parse(text)
    except ConfigError as e:
        assert str(e).startswith(f"{PROP}: ")
    else:
        assert entries
        assert all(e.flag in ("required", "requisite", "sufficient", "optional") for e in entries)
