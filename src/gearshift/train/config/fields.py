"""A section as a flat table of keys: its own keys (gearshift.keys.key) and those of the dataclasses it embeds
(`embed`: the settings a component reads, declared there), so `[parallel] bucket_mb` is the key of the
SyncSettings that [parallel] embeds."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any

from gearshift.keys import is_key


def embed(cls: type) -> Any:
    """A section field holding a component's settings (`cls`, at its defaults): their keys are the section's."""
    return dataclasses.field(default_factory=cls, metadata={"embed": True})


def section_keys(cls: type) -> dict[str, tuple[str | None, dataclasses.Field, Any]]:
    """Key -> (the embedded field that holds it, or None for the section's own; its Field; its type), in the
    order the section declares them."""
    out: dict[str, tuple[str | None, dataclasses.Field, Any]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("embed"):
            inner = typing.get_type_hints(hints[f.name])
            out.update({g.name: (f.name, g, inner[g.name]) for g in dataclasses.fields(hints[f.name]) if is_key(g)})
        elif is_key(f):
            out[f.name] = (None, f, hints[f.name])
    return out


def holder(section: object, name: str) -> object:
    """The object that holds key `name` of `section`: the section, or the dataclass it embeds with that key."""
    home = section_keys(type(section))[name][0]
    return section if home is None else getattr(section, home)


def set_key(section: object, name: str, value: Any) -> None:
    setattr(holder(section, name), name, value)


def flat(section: object) -> dict[str, Any]:
    """Every key of `section` with its value (copied): the section as its TOML table."""
    return {name: copy.deepcopy(getattr(holder(section, name), name)) for name in section_keys(type(section))}
