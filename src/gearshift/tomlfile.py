"""Reading TOML files for configs and cluster specs, with one-line errors that name the field."""

from __future__ import annotations

import sys
from pathlib import Path

from gearshift.errors import UserError
from gearshift.paths import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError
loads = tomllib.loads


def read_toml(path: str | Path, field: str, error: type[UserError] = UserError) -> dict:
    """Parse the TOML file at `path`; a missing or invalid file raises `error` naming `field`."""
    text = read_text(path, field, error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{field}: {path} is not valid TOML ({e})") from None
