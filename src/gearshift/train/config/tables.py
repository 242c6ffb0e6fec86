"""TOML tables onto a JobConfig: each value checked against its key's type (ints accepted for floats), unknown
sections and keys named with what is allowed, and `--section.key=value` overrides parsed as TOML values."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any

from gearshift.errors import ConfigError, UsageError
from gearshift.imports import is_import_path
from gearshift.tomlfile import TOMLDecodeError, loads
from gearshift.train.config.fields import section_keys, set_key
from gearshift.train.config.model import given

SPEC_SECTIONS = {"types", "nodes", "network"}  # a cluster spec's (gearshift.cluster.spec), not a job's


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def coerce(where: str, tp: Any, value: Any) -> Any:
    """Check a TOML value against a key's type; ints are accepted for floats, nan and inf are not."""
    if tp is Any:  # passed through as given (a custom model's own keys)
        return value
    if isinstance(value, float) and not math.isfinite(value):  # TOML's nan and inf: no key of ours means either
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return coerce(where, arg, value)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: unexpected value {value!r}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [coerce(f"{where}[{i}]", inner, v) for i, v in enumerate(value)]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}{_quoted_hint(tp, value)}")


def _quoted_hint(tp: Any, value: Any) -> str:
    """" (a string: drop the quotes)" for a number or boolean written in quotes ("3e-3", "true"), a habit from
    JSON and YAML configs; "" otherwise."""
    if not isinstance(value, str) or tp not in (int, float, bool):
        return ""
    try:
        v = loads(f"v = {value.strip()}")["v"]
        ok = isinstance(v, (int, float) if tp is float else tp) and (tp is bool or not isinstance(v, bool))
    except TOMLDecodeError:
        ok = False
    return " (a string: drop the quotes)" if ok else ""


def _did_you_mean(cfg: Any, sec: str, name: str, keys: list[str]) -> str:
    """"; did you mean SEC.KEY?" for a mistyped key: the closest key of its section, else the same key in another
    section (`train.workers` -> cluster.workers); "" when none is close."""
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.7)
    if close:
        return f"; did you mean {sec}.{close[0]}?"
    homes = [f.name for f in dataclasses.fields(cfg) if name in section_keys(type(getattr(cfg, f.name)))]
    return f"; did you mean {homes[0]}.{name}?" if homes else ""


def apply(cfg: Any, data: dict, origin: str) -> None:
    """Set the keys of `data` ({section: {key: value}}) on `cfg`; `origin` names where they came from."""
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    for sec, table in data.items():
        if not isinstance(table, dict):  # e.g. `steps = 5` above any [section]
            if sec in sections:
                raise ConfigError(f"{origin}: [{sec}] must be a table of keys, got {sec} = {table!r}")
            homes = [name for name in sections if sec in section_keys(type(getattr(cfg, name)))]
            where = f"under [{homes[0]}]" if homes else f"under a section ({', '.join(sections)})"
            raise ConfigError(f"{origin}: {sec} = {table!r} is outside any section; it goes {where}")
        if sec not in sections:
            if origin != "override" and set(data) <= SPEC_SECTIONS:
                raise ConfigError(f"{origin}: this is a cluster spec ([{sec}]), not a job; name it in a job as "
                                  f"cluster.spec = \"{origin}\" (or --cluster.spec={origin}, or `gearshift plan "
                                  f"--spec {origin}`)")
            close = difflib.get_close_matches(sec, list(sections), n=1, cutoff=0.6)
            hint = f"; did you mean [{close[0]}]?" if close else ""
            raise ConfigError(f"{origin}: unknown section [{sec}] (allowed: {', '.join(sections)}){hint}")
        obj = getattr(cfg, sec)
        keys = section_keys(type(obj))
        if "options" in keys:
            _apply_free_form(cfg, obj, sec, table, keys)
            continue
        for name, value in table.items():
            if name not in keys:
                raise ConfigError(f"{sec}.{name}: unknown key (allowed in [{sec}]: {', '.join(keys)})"
                                  f"{_did_you_mean(cfg, sec, name, list(keys))}")
            set_key(obj, name, coerce(f"{sec}.{name}", keys[name][2], value))


def _apply_free_form(cfg: Any, obj: Any, sec: str, table: dict, keys: dict) -> None:
    """[model] or [data]: `name` first; with an import path every other key is free-form (kept in `options`,
    passed to the function), else each must be a key. Turning an import path back into a built-in name applies
    the keys collected so far as keys."""
    table = dict(table)
    if "name" in table:
        was = obj.name
        obj.name = coerce(f"{sec}.name", str, table.pop("name"))
        if is_import_path(was) and not is_import_path(obj.name):
            table, obj.options = {**obj.options, **table}, {}
    fields = [k for k in keys if k != "options"]
    always = getattr(type(obj), "ALWAYS_KEYS", ())  # keys of the section whatever the model or dataset
    for name, value in table.items():
        if is_import_path(obj.name) and name not in always:
            obj.options[name] = value
        elif name not in fields:
            raise ConfigError(f"{sec}.{name}: unknown key (allowed in [{sec}]: {', '.join(fields)}; other keys need "
                              f"{sec}.name = 'package.module:function'){_did_you_mean(cfg, sec, name, fields)}")
        else:
            set_key(obj, name, coerce(f"{sec}.{name}", keys[name][2], value))
            given(obj).add(name)


def check_override_spelling(argv: list[str]) -> None:
    """An override is one argument, `--section.key=value`; `--train.steps 5` (a space for `=`) would
    otherwise read as a config file named 5."""
    for i, arg in enumerate(argv):
        if arg.startswith("--") and "=" not in arg and "." in arg:
            nxt = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
            got = f" (got a space: {arg} {nxt})" if nxt is not None else ""
            raise UsageError(f"{arg}: expected {arg}=VALUE{got}")


def parse_override(arg: str) -> tuple[str, str, Any]:
    """'--train.steps=50' -> ('train', 'steps', 50); the value is read as a TOML value, else a string."""
    if not arg.startswith("-"):
        raise UsageError(f"unexpected argument {arg!r}: one config file, then --section.key=value overrides")
    body = arg[2:] if arg.startswith("--") else arg
    if "=" not in body or "." not in body.split("=", 1)[0]:
        raise ConfigError(f"override {arg!r}: expected --section.key=value (e.g. --train.steps=50)")
    key, raw = body.split("=", 1)
    sec, name = key.split(".", 1)
    try:
        value = loads(f"v = {raw}")["v"]
    except TOMLDecodeError:
        value = raw
    return sec, name, value
