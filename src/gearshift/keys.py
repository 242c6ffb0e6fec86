"""Config keys: a dataclass field with its default and the one-line doc that `gearshift train --help` prints.
The component that reads a setting declares it (models.config, comm.settings, cluster.emulate, train.config),
so each key has one default and one doc. Fields declared without `key` are not config keys."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any


def key(default: Any, doc: str) -> Any:
    """A config key: its default and its one-line doc."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


def is_key(f: dataclasses.Field) -> bool:
    """Whether a dataclass field is a config key (declared with `key`)."""
    return "doc" in f.metadata


def key_names(cls: type) -> list[str]:
    """The config keys a dataclass declares, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if is_key(f)]
