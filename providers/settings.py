"""The schema machinery the whole configuration file is read with, and the checks the clouds'
settings share. Each cloud's ``[providers.NAME]`` schema lives in its package
(``providers/aws/settings.py``, ...) and is named by its registration; the ``[providers]`` table
of them all is :class:`providers.registry.ProvidersSettings`.

Built on msgspec (``Struct(forbid_unknown_fields=True)`` and ``msgspec.convert``): it checks
types, refuses unknown keys and costs ~15 ms of imports, against ~270 ms for pydantic-settings
(measured on the ``broker --help`` path; see the README). msgspec reports where a value is wrong
but not which key of a table it sat under, nor which key was meant; :func:`convert` adds both, so
every problem is one sentence naming the full dotted key::

    budgets.default.usd_per_hr is not a setting (did you mean usd_per_hour?)

No cloud SDK is imported here: the schema is checked before any provider is built.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Annotated, Any, Literal, Mapping, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

import msgspec

__all__ = ["SettingsError", "Table", "convert", "is_loopback_url", "provider_table"]

#: No number anywhere in the configuration may be larger than this in magnitude (nor NaN or inf).
NUMBER_LIMIT = 1_000_000_000


class SettingsError(ValueError):
    """A settings table is wrong; the message is one sentence naming the dotted key. The broker
    reports it as :class:`broker.errors.ConfigError` (exit 2)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class Table(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A configuration table: typed keys with defaults, no unknown key accepted.

    ``__post_init__`` checks that reach beyond one value raise ``ValueError("KEY sentence")``
    with KEY a key of this table; :func:`convert` prefixes the table's path."""


def bad(key: str, sentence: str) -> ValueError:
    return ValueError(f"{key} {sentence}")


Seconds = Annotated[float, msgspec.Meta(gt=0, le=NUMBER_LIMIT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=NUMBER_LIMIT)]
T = TypeVar("T", bound=Table)


# ---------------------------------------------------------------------------------------------
# converting, with sentences that name the key


def convert(raw: Any, typ: Any, where: str = "", sources: Mapping[str, str] | None = None) -> Any:
    """``raw`` (plain TOML data) as ``typ``, or :class:`SettingsError` naming the dotted key.

    ``where`` prefixes every key (``providers.aws``); ``sources`` maps a dotted key to the
    environment variable that set it, so the sentence names the variable the user wrote."""
    try:
        _check_numbers(raw, where)
    except SettingsError as e:  # name the environment variable that set it, as every other sentence
        env = (sources or {}).get(e.key.removeprefix(f"{where}.") if where else e.key, "")
        if env:
            raise SettingsError(f"environment variable {env} (setting {e.key}){str(e)[len(e.key):]}", e.key) from None
        raise
    try:
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as e:
        raise _sentence(str(e), raw, typ, where, sources or {}) from None


def _check_numbers(value: Any, path: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or abs(value) > NUMBER_LIMIT:
            raise SettingsError(f"{path or 'value'} must be a finite number of at most {NUMBER_LIMIT:,} "
                                f"in magnitude, got {value!r}", path)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_numbers(v, path if path == _TOKENS else f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}[{i}]")


_AT = re.compile(r"^(?P<msg>.*) - at `(?P<key>key` in `)?\$(?P<path>.*)`$", re.S)
# Settings whose values are secrets (tokens, a database URL with its password): never echoed.
_SECRET = ("auth", "store.url")
_TOKENS = "auth.tokens"  # a table whose keys are secrets too: a sentence names the table, never a key
_TOKEN = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+|\.\.\.)\]")


def _unwrap(typ: Any) -> Any:
    """The one structured type inside Annotated / Optional / a union with str/scalars."""
    while True:
        origin = get_origin(typ)
        if origin is Annotated:
            typ = get_args(typ)[0]
        elif origin is Union or type(typ).__name__ == "UnionType":
            args = [a for a in get_args(typ) if a is not type(None)]
            structured = [a for a in args if _is_table(a) or get_origin(a) in (dict, list, tuple)]
            typ = structured[0] if structured else args[0]
        else:
            return typ


def _is_table(typ: Any) -> bool:
    return isinstance(typ, type) and issubclass(typ, msgspec.Struct)


def _field_types(typ: Any) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(typ)}


def _locate(raw: Any, typ: Any, tokens: list[tuple[str, str]]) -> tuple[list[str], Any, Any]:
    """Walk ``tokens`` of a msgspec path through the data and the type: (keys, value, type)."""
    keys: list[str] = []
    for name, index in tokens:
        typ = _unwrap(typ)
        if name:
            keys.append(name)
            raw = raw.get(name) if isinstance(raw, Mapping) else None
            typ = _field_types(typ).get(name, Any) if _is_table(typ) else Any
        elif index == "...":  # a key of a table msgspec does not name: find the entry that fails
            value_type = get_args(typ)[1] if get_origin(typ) is dict else Any
            found = None
            for k, v in (raw.items() if isinstance(raw, Mapping) else ()):
                try:
                    msgspec.convert(v, value_type, strict=True)
                except msgspec.ValidationError:
                    found = (k, v)
                    break
            if found is None:
                return keys + ["?"], None, Any
            keys.append(str(found[0]))
            raw, typ = found[1], value_type
        else:
            if keys:
                keys[-1] += f"[{index}]"
            else:
                keys.append(f"[{index}]")
            raw = raw[int(index)] if isinstance(raw, (list, tuple)) and int(index) < len(raw) else None
            args = get_args(typ)
            typ = args[0] if args else Any
    return keys, raw, _unwrap(typ)


def _converts(value: Any, typ: Any) -> bool:
    try:
        msgspec.convert(value, typ, strict=True)
        return True
    except msgspec.ValidationError:
        return False


def _sentence(text: str, raw: Any, typ: Any, where: str, sources: Mapping[str, str]) -> SettingsError:
    m = _AT.match(text)
    msg, path = (m["msg"], m["path"]) if m else (text, "")
    keys, value, here = _locate(raw, typ, [(a or "", b or "") for a, b in _TOKEN.findall(path)])
    prefix = ".".join(p for p in (where, *keys) if p)
    secret = any(prefix == s or prefix.startswith(f"{s}.") for s in _SECRET)
    if prefix.startswith(f"{_TOKENS}."):
        prefix = _TOKENS
    if m and m["key"]:  # a table's key (a name) fails its rule: say which, never the table
        rule = get_args(here)[0] if get_origin(here) is dict else Any
        bad_key = next((k for k in (value if isinstance(value, Mapping) else ())
                        if not _converts(k, rule)), None)
        named = "" if secret or bad_key is None else f" {json.dumps(bad_key)}"
        return SettingsError(f"{prefix}: the name{named} cannot be used: {msg.replace('Expected `str`', 'a name must be a string')}",
                             prefix)
    if secret or not isinstance(value, (str, int, float, bool)):
        value = None  # a table is not echoed (it may hold secrets); a secret never is

    def env_of(key: str) -> str:
        """The environment variable that set ``key`` or a key inside it, if one did."""
        return next((v for k, v in sources.items() if k == key or k.startswith(f"{key}.")), "")

    def name(key: str) -> str:
        env = env_of(key)
        return f"environment variable {env} (setting {key})" if env else key

    unknown = re.match(r"Object contains unknown field `(.+)`", msg)
    if unknown:
        key = f"{prefix}.{unknown[1]}" if prefix else unknown[1]
        known = sorted(_field_types(here)) if _is_table(here) else []
        import difflib  # a typo's suggestion: off the path of every good configuration

        close = difflib.get_close_matches(unknown[1], known, n=1, cutoff=0.6)
        env = env_of(key)
        if env:
            meant = f"{prefix}.{close[0]}" if close and prefix else (close[0] if close else "")
            wrong, right = (f"BROKER_{k.upper().replace('.', '__')}" for k in (key, meant))
            hint = f" (did you mean {env.replace(wrong, right, 1)}?)" if meant else ""
            return SettingsError(f"environment variable {env} names {key}, which is not a setting{hint}", key)
        hint = f" (did you mean {close[0]}?)" if close else (f"; known: {', '.join(known)}" if known else "")
        return SettingsError(f"{key} is not a setting{hint}", key)
    missing = re.match(r"Object missing required field `(.+)`", msg)
    if missing:
        key = f"{prefix}.{missing[1]}" if prefix else missing[1]
        return SettingsError(f"{name(key)} is required", key)
    if _is_table(here) and not re.match(r"Expected `", msg):
        first = msg.split(" ", 1)[0]
        if first.split(".")[0].split("[")[0] in _field_types(here):  # "KEY sentence" from __post_init__
            key = f"{prefix}.{first}" if prefix else first
            return SettingsError(f"{name(key)} {msg.split(' ', 1)[1]}", key)
        return SettingsError(f"{name(prefix)}: {msg}", prefix)
    expected = re.match(r"Expected `(.+?)`(?:, got `(.+)`)?(.*)", msg)
    if expected:
        want = expected[1].replace(" | null", "").replace("str", "a string").replace("bool", "true or false")
        want = want.replace("int", "a whole number").replace("float", "a number").replace("array", "a list")
        want = want.replace("object", "a table")
        bound = expected[3].strip()
        got = f", got {json.dumps(value) if isinstance(value, bool) else repr(value)}" if value is not None else ""
        return SettingsError(f"{name(prefix)} must be {want}{(' ' + bound) if bound else ''}{got}", prefix)
    invalid = re.match(r"Invalid enum value (.+)", msg)
    if invalid:
        choices = [a for a in get_args(here) if isinstance(a, str)] if get_origin(here) is Literal else []
        one_of = f"; one of {', '.join(choices)}" if choices else ""
        return SettingsError(f"{name(prefix)} cannot be {invalid[1]}{one_of}", prefix)
    return SettingsError(f"{name(prefix)}: {msg}", prefix)


# ---------------------------------------------------------------------------------------------
# small checks the providers share


def is_loopback_url(url: str) -> bool:
    """True when ``url`` points at this machine (127.0.0.0/8, ::1 or localhost)."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_anonymous(credentials: str, endpoint: str, endpoint_key: str) -> None:
    """``credentials = "anonymous"`` is for emulators and tests on loopback only."""
    if credentials == "anonymous" and not (endpoint and is_loopback_url(endpoint)):
        raise bad("credentials", f"= \"anonymous\" is only accepted with {endpoint_key} on a loopback address")


def provider_table(schema: type[T], name: str, raw: Any) -> T:
    """The typed ``[providers.NAME]`` settings of ``schema`` from a raw table (``enabled`` defaults
    to true: a table handed to a provider is one it is built from), or ``raw`` itself when typed."""
    if isinstance(raw, schema):
        return raw
    if not isinstance(raw, Mapping):
        raise SettingsError(f"providers.{name} must be a table", f"providers.{name}")
    return convert({"enabled": True, **raw}, schema, f"providers.{name}")
