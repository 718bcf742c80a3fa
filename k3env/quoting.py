"""Text for documents others parse (a YAML recipe, a TOML spec, a shell line): every value k3env
puts into one goes through a function here, never interpolated as it is.

YAML: a string is a double-quoted scalar (``quoted``: every character YAML may not hold raw,
and every line break, escaped with YAML's own escapes; a character beyond the BMP as one
32-bit escape, never a JSON surrogate pair), a key or a value that is plainly safe stays
plain, a float keeps its type in YAML 1.1 and 1.2 alike. A comment holds one line: control
characters and line separators escaped. Shell: ``shlex.quote``.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping

# A plain scalar no YAML parser reads as anything but this string: no indicator first, no
# `: ` or ` #` inside, and not a word YAML 1.1 reads as a boolean or null.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./+-]*")
_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back as ``text`` exactly."""
    return '"' + "".join(_escape(ch) for ch in text) + '"'


def _escape(ch: str) -> str:
    if ch in '"\\':
        return "\\" + ch
    code = ord(ch)
    if 0x20 <= code < 0x7F:
        return ch
    # Raw where YAML allows it (its printable set, less line breaks and the BOM).
    if (0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000) and ch not in (
        "\u2028\u2029\ufeff"
    ):
        return ch
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def yaml_string(text: str) -> str:
    """``text`` as a YAML scalar (a key or a value): plain when that is safe, else
    double-quoted."""
    if _PLAIN.fullmatch(text) and text.lower() not in _WORDS:
        return text
    return quoted(text)


def yaml_scalar(value: object) -> str:
    """A YAML flow value: a string always double-quoted (JSON), a number, a boolean, null, or a
    list or mapping in flow style of those."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        # YAML 1.1 (PyYAML) reads `1e-05` as a string: its floats have a dot.
        mantissa, e, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        if e and exponent[:1] not in "+-":
            exponent = "+" + exponent
        return mantissa + (e + exponent if e else "")
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{quoted(str(k))}: {yaml_scalar(v)}" for k, v in value.items()) + "}"
        )
    return quoted(str(value))


def one_line(text: str) -> str:
    """``text`` safe on one line (a ``#`` comment, a message): every control character, line
    or paragraph separator (YAML 1.1 breaks lines at U+0085, U+2028, U+2029) or undecodable
    byte escaped."""
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode()
        for ch in text
    )


def visible(text: str) -> str:
    """``text`` for a person's terminal: its line breaks (``\\n``) kept, every other control
    character (an escape sequence, a carriage return) escaped as ``one_line`` does."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def shell_word(text: str) -> str:
    """``text`` as one shell word (POSIX quoting)."""
    return shlex.quote(text)


# TOML (an image spec `k3env adopt` writes): a basic string with TOML's escapes, a key bare
# when TOML allows it, floats as TOML spells them.
_TOML_BARE = re.compile(r"[A-Za-z0-9_-]+")
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}  # fmt: skip


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string that reads back as ``text`` exactly."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F or 0x80 <= code <= 0x9F or ch in "\u2028\u2029":
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(text: str) -> str:
    return text if _TOML_BARE.fullmatch(text) else toml_string(text)


def toml_value(value: object) -> str:
    """A TOML value: a string, number, boolean, or an array / inline table of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    return toml_string(str(value))
