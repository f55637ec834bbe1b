"""Kafka's ``sasl.jaas.config`` value: login modules with their options, read as Kafka's
``JaasConfig`` reads it (a ``java.io.StreamTokenizer`` set up as below), so a value that works
with a Kafka broker means the same here.

Grammar: ``(<module> <flag> (<key>=<value>)* ;)+`` where ``<flag>`` is ``required``,
``requisite``, ``sufficient`` or ``optional`` (any case).

==================  =========================================================================
token               characters
==================  =========================================================================
blank               U+0000..U+0020: separate tokens
word                every other character but ``"`` ``'`` ``;`` ``=`` ``/`` and U+0081..U+009F
quoted              between ``"`` or ``'``; ``\\n`` ``\\t`` ``\\r`` ``\\b`` ``\\f`` ``\\a``
                    ``\\v``, octal ``\\0``-``\\377`` and ``\\<any>`` (that character) escape;
                    the quote closes it, so does an unescaped line end
``;`` ``=``         themselves
comment             ``//`` or a lone ``/`` to the end of the line, ``/* ... */``
==================  =========================================================================

``PlainLoginModule`` lists PLAIN's users as ``user_<name>="<password>"`` options
(:func:`plain_users`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from storage.config_def import ConfigError

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
FLAGS = ("required", "requisite", "sufficient", "optional")
_USER_PREFIX = "user_"


@dataclass(slots=True, frozen=True)
class LoginModuleEntry:
    """One login module of a JAAS config: its class, its control flag (lower case) and its
    options."""

    module: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)


def parse_jaas_config(text: str, property_name: str) -> list[LoginModuleEntry]:
    """The login modules ``text`` configures; a :class:`ConfigError` naming ``property_name``
    (and saying what is wrong, as Kafka does) when it does not parse."""
    tokens = _Tokenizer(text, property_name)
    entries: list[LoginModuleEntry] = []
    token = tokens.next()
    while token is not _EOF:
        entries.append(_entry(token, tokens, property_name))
        token = tokens.next()
    if not entries:
        raise ConfigError(f"{property_name}: Login module not specified in JAAS config")
    return entries


def plain_users(entries: Iterable[LoginModuleEntry]) -> dict[str, str]:
    """PLAIN's users and passwords: the ``user_<name>`` options of the ``PlainLoginModule``
    entries (the first entry naming a user wins, as Kafka's ``configEntryOption`` looks)."""
    users: dict[str, str] = {}
    for entry in entries:
        if entry.module != PLAIN_LOGIN_MODULE:
            continue
        for key, value in entry.options.items():
            name = key[len(_USER_PREFIX) :]
            # an empty name can never log in (PLAIN refuses an empty user name)
            if key.startswith(_USER_PREFIX) and name:
                users.setdefault(name, value)
    return users


@dataclass(slots=True, frozen=True)
class _Token:
    """A word or quoted string (``text``), or an ordinary character (``char``)."""

    text: str | None = None
    char: str | None = None


_EOF = _Token()
_SEMICOLON = _Token(char=";")
_EQUALS = _Token(char="=")


def _entry(first: _Token, tokens: _Tokenizer, prop: str) -> LoginModuleEntry:
    module = first.text
    if not module:
        raise ConfigError(f"{prop}: Login module name not specified in JAAS config")
    token = tokens.next()
    if token is _EOF:
        raise ConfigError(f"{prop}: Login module control flag not specified in JAAS config")
    if token.text is None:
        raise ConfigError(f"{prop}: Login module control flag is not available in the JAAS config")
    flag = token.text.lower()
    if flag not in FLAGS:
        raise ConfigError(
            f"{prop}: Invalid login module control flag '{token.text}' in JAAS config"
        )
    options: dict[str, str] = {}
    token = tokens.next()
    while token is not _EOF and token != _SEMICOLON:
        key = token.text
        if key is None:
            raise ConfigError(f"{prop}: Option name expected in JAAS config, got '{token.char}'")
        if tokens.next() != _EQUALS:
            raise ConfigError(f"{prop}: Value not specified for key '{key}' in JAAS config")
        value = tokens.next()
        if value.text is None:
            raise ConfigError(f"{prop}: Value not specified for key '{key}' in JAAS config")
        options[key] = value.text
        token = tokens.next()
    if token != _SEMICOLON:
        raise ConfigError(f"{prop}: JAAS config entry not terminated by semi-colon")
    return LoginModuleEntry(module, flag, options)


def _is_word(c: str) -> bool:
    """StreamTokenizer's word characters as Kafka's JaasConfig sets them up."""
    o = ord(c)
    if o >= 256:
        return True
    if 0x21 <= o <= 0x80:
        return c not in "\"';=/"
    return o >= 0xA0


_ESCAPES = {"a": "\x07", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b"}


class _Tokenizer:
    """The tokens of a JAAS config value, as Kafka's configured StreamTokenizer yields them."""

    __slots__ = ("_pos", "_prop", "_text")

    def __init__(self, text: str, prop: str) -> None:
        self._text = text
        self._pos = 0
        self._prop = prop

    def _read(self) -> str:
        """The next character, or "" at the end."""
        if self._pos >= len(self._text):
            self._pos += 1  # reading past the end keeps "unread" arithmetic simple
            return ""
        c = self._text[self._pos]
        self._pos += 1
        return c

    def _unread(self) -> None:
        self._pos -= 1

    def next(self) -> _Token:
        c = self._read()
        while c and ord(c) <= 0x20:
            c = self._read()
        if not c:
            return _EOF
        if _is_word(c):
            start = self._pos - 1
            c = self._read()
            while c and _is_word(c):
                c = self._read()
            self._unread()
            return _Token(text=self._text[start : self._pos])
        if c in "\"'":
            return self._quoted(c)
        if c == "/":
            return self._after_slash()
        return _Token(char=c)

    def _quoted(self, quote: str) -> _Token:
        out: list[str] = []
        d = self._read()
        while d and d != quote and d not in "\n\r":
            if d != "\\":
                out.append(d)
                d = self._read()
                continue
            c = self._read()
            if not c:
                break
            if "0" <= c <= "7":
                # up to three octal digits, the third only after a first digit 0-3 (<= \377)
                value = int(c)
                c2 = self._read()
                if c2 and "0" <= c2 <= "7":
                    value = value * 8 + int(c2)
                    c3 = self._read()
                    if c3 and "0" <= c3 <= "7" and c <= "3":
                        value = value * 8 + int(c3)
                        d = self._read()
                    else:
                        d = c3
                else:
                    d = c2
                out.append(chr(value))
                continue
            out.append(_ESCAPES.get(c, c))
            d = self._read()
        if d != quote:
            # StreamTokenizer ends such a string silently; a value cut short is refused here
            raise ConfigError(f"{self._prop}: Unterminated quoted string in JAAS config")
        return _Token(text="".join(out))

    def _after_slash(self) -> _Token:
        c = self._read()
        if c == "*":
            previous = ""
            c = self._read()
            while c and not (c == "/" and previous == "*"):
                previous = c
                c = self._read()
            return self.next() if c else _EOF
        # "//" or a lone "/" (the comment character): the rest of the line; StreamTokenizer
        # does not look at the character after a lone "/" for the line's end
        c = self._read()
        while c and c not in "\n\r":
            c = self._read()
        return self.next()
