"""The one strict loader of records: params.yaml's knobs and the stages' reports alike.

A record is a dataclass. Unknown keys are refused (naming the closest known
one), and so are missing keys that have no default; nested records, lists,
dicts and Optionals are checked to their leaves, where a field's rules (its
metadata) apply. The caller says how a problem reads to the user.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def build_record(kind: type[T], raw: Any, prefix: str, fail: Callable[[str], Exception], *,
                 empty_strings: bool = False) -> T:
    """Build dataclass ``kind`` from ``raw`` strictly: the one loader of params.yaml and of the stages' reports.

    Unknown keys are refused (naming the closest known one), and so are missing
    keys that have no default; nested records, lists, dicts and Optionals are
    checked to their leaves, where a field's rules (its metadata: choices, ge,
    gt, lt, min_len, item_*, empty, auto) apply.

    Args:
        kind: the dataclass.
        raw: the data as YAML or JSON gave it.
        prefix: the dotted key ``raw`` sits under ("" at the top), for messages.
        fail: turns a message naming the key into the exception to raise.
        empty_strings: whether a ``str`` field may be ``""`` (else only where its ``empty`` rule says).
    """
    if not isinstance(raw, dict):
        raise fail(f"{prefix.rstrip('.') or kind.__name__} must be a section of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            known = f" (known: {', '.join(fields)})" if len(fields) <= 20 else ""  # a report's 50 would drown the line
            raise fail(f"unknown key {prefix}{key}{hint}{known}")
    missing = [f"{prefix}{name}" for name, f in fields.items() if name not in raw and _required(f)]
    if missing:
        raise fail(f"missing {', '.join(missing)}")
    hints = typing.get_type_hints(kind)
    values = {name: _typed(hints[name], raw[name], f"{prefix}{name}", fail, f.metadata, empty_strings)
              for name, f in fields.items() if name in raw}
    return kind(**values)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _typed(kind: Any, value: Any, key: str, fail: Callable[[str], Exception], rules: typing.Mapping[str, Any],
           empty_strings: bool) -> Any:
    """``value`` as ``kind`` (int -> float only), down to its leaves, with ``rules`` enforced."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return build_record(kind, value, f"{key}.", fail, empty_strings=empty_strings)
    if rules.get("auto"):  # a whole number, or auto: tfdist chooses (the knob's docstring says how)
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"{key} must be a whole number or auto; got {value!r} ({type(value).__name__})")
        origin, kind = None, int
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kind = next(arg for arg in args if arg is not type(None))
        return _typed(kind, value, key, fail, rules, empty_strings)
    if origin is list:
        if not isinstance(value, list):
            raise fail(f"{key} must be a list, got {value!r}")
        if len(value) < rules.get("min_len", 0):
            raise fail(f"{key} must list at least {rules['min_len']} item(s)")
        item_rules = {k[5:]: v for k, v in rules.items() if k.startswith("item_")}
        return [_typed(args[0], v, f"{key}[{i}]", fail, item_rules, empty_strings) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail(f"{key} must be a section of keys, got {value!r}")
        return {str(k): _typed(args[1], v, f"{key}.{k}", fail, {}, empty_strings) for k, v in value.items()}
    if rules.get("empty") and value in ("", None):  # a string knob that may be left unset
        return ""
    value = _coerce(key, value, kind, fail, empty_strings)
    if rules.get("secretless") and _holds_password(value):
        raise fail(f"{key} holds a password, which would be logged with every run and committed in dvc.lock: "
                   "remove it and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (a server), "
                   "or a line in ~/.pgpass (PostgreSQL)")
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        raise fail(f"{key} must be one of {', '.join(choices)}; got {value!r}")
    for rule, test, word in (("ge", float.__ge__, ">="), ("gt", float.__gt__, ">"), ("lt", float.__lt__, "<")):
        if rule in rules and not test(float(value), float(rules[rule])):
            raise fail(f"{key} must be {word} {rules[rule]}; got {value!r}")
    return value


def _holds_password(uri: str) -> bool:
    parts = urllib.parse.urlsplit(uri)
    return parts.password is not None or "password" in urllib.parse.parse_qs(parts.query)


def _coerce(key: str, value: Any, kind: type, fail: Callable[[str], Exception], empty_strings: bool) -> Any:
    # YAML reads `off`/`no` as False and `1e-3` as a string: name both mistakes.
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str) and (value or empty_strings):
            return value
        if isinstance(value, bool):  # on/off/yes/no unquoted: YAML 1.1 reads them as booleans
            raise fail(f"{key} must be {_TYPE_WORDS[kind]}; got {value!r}: YAML reads an unquoted "
                       "on, off, yes or no as true or false; quote it, or write the value the key names")
    raise fail(f"{key} must be {_TYPE_WORDS.get(kind, getattr(kind, '__name__', str(kind)))}; got {value!r} "
               f"({type(value).__name__})")


_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a non-empty string"}
