"""Checks on the paths a user names (config fields, command-line options), so that a path that cannot be
read or written fails with one line naming the field before any work starts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gearshift.errors import UserError


def check_dir(path: str | Path, field: str, error: type[UserError] = UserError) -> None:
    """`path` is a directory, or one can be made there: neither it nor an existing parent is a file."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise error(f"{field}: {p} is a file, not a directory")
    _check_parents(p, field, error)


@contextmanager
def writing(path: str | Path, field: str, error: type[UserError] = UserError) -> Iterator[None]:
    """An OSError while writing `path` (a folder that cannot be made, a full disk, no permission) is one line naming
    `field`, not a traceback: for writes whose failure a check beforehand cannot foresee."""
    try:
        yield
    except OSError as e:
        raise error(f"{field}: cannot write {path}: {e.strerror or e}") from None


def check_output_file(path: str | Path, field: str, error: type[UserError] = UserError) -> None:
    """A file can be written at `path`: it is not a directory and no existing parent is a file."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise error(f"{field}: {p} is a directory, not a file")
    _check_parents(p, field, error)


def _check_parents(p: Path, field: str, error: type[UserError]) -> None:
    """The nearest existing parent of `p` is a directory (mkdir -p would fail under a file)."""
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise error(f"{field}: {p} is under {parent}, which is a file, not a directory")
            return


def check_input_file(path: str | Path, field: str, error: type[UserError] = UserError) -> Path:
    """`path` is an existing file (not a directory); returns it."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise error(f"{field}: {p} is a directory, not a file")
    if not p.is_file():
        raise error(f"{field}: file not found: {p}")
    return p


def read_text(path: str | Path, field: str, error: type[UserError] = UserError) -> str:
    """The text of an existing UTF-8 file; a missing, unreadable or binary file raises `error` naming `field`."""
    p = check_input_file(path, field, error)
    try:
        return p.read_text()
    except UnicodeDecodeError:
        raise error(f"{field}: {p} is not UTF-8 text") from None
    except OSError as e:
        raise error(f"{field}: cannot read {p} ({e.strerror})") from None


def read_parsed(path: str | Path, field: str, parse: Callable[[str], Any], fails: type[Exception], what: str,
                error: type[UserError] = UserError) -> Any:
    """parse() of the text at `path`; a missing file, or text that `parse` rejects with `fails`, raises
    `error` naming `field` and saying the file is not valid `what`."""
    text = read_text(path, field, error)
    try:
        return parse(text)
    except fails as e:
        raise error(f"{field}: {path} is not valid {what} ({e})") from None


def read_json(path: str | Path, field: str, error: type[UserError] = UserError) -> Any:
    """The JSON file at `path`; a missing or invalid file raises `error` naming `field`."""
    return read_parsed(path, field, json.loads, json.JSONDecodeError, "JSON", error)
