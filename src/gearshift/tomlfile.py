"""Reading TOML files for configs and cluster specs, with one-line errors that name the field."""

from __future__ import annotations

import sys
from pathlib import Path

from gearshift.errors import UserError
from gearshift.paths import read_parsed

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError
loads = tomllib.loads


def read_toml(path: str | Path, field: str, error: type[UserError] = UserError) -> dict:
    """Parse the TOML file at `path`; a missing or invalid file raises `error` naming `field`."""
    return read_parsed(path, field, tomllib.loads, tomllib.TOMLDecodeError, "TOML", error)
