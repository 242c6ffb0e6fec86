"""Functions named by import path ("package.module:function"): what a config names for a custom model or
dataset, resolved the same way in the launcher and in every worker; and `lazy_exports`, by which a package
names what it exports from heavier modules without importing them."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from gearshift.errors import ConfigError, UserError


def is_import_path(name: str) -> bool:
    """Whether a config name is an import path ("package.module:function") rather than a built-in name."""
    return ":" in name


def _split(path: str, where: str) -> tuple[str, str]:
    """("package.module", "qualname") of an import path, with the working directory on the Python path (as
    `python -m` has it; console scripts leave it out); a ConfigError naming `where` for a malformed path."""
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        raise ConfigError(f"{where}: {path!r} is not an import path (expected 'package.module:function')")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return module_name, qualname


def check_findable(path: str, where: str) -> None:
    """That the top package of "package.module:function" can be found, without importing anything (config
    loading never imports the user's code): a mistyped module is the one line the user sees, before any check of
    the keys that depend on the model."""
    module_name, _ = _split(path, where)
    top = module_name.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"{where}: cannot import {module_name!r} for {path!r} (no module named {top!r} on the "
                          f"Python path or in the working directory)")


def import_object(path: str, where: str) -> Callable:
    """The callable at "package.module:qualname", importable from the working directory or the Python
    path; a ConfigError naming `where` (the config field) when it cannot be had."""
    module_name, qualname = _split(path, where)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import {module_name!r} for {path!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: say how, in one line
        raise ConfigError(f"{where}: importing {module_name!r} raised {type(e).__name__}: {e}") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: {module_name!r} has no {qualname!r} (from {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}: {path!r} is a {type(obj).__name__}, not a function")
    return obj


def path_of(fn: Callable, where: str) -> str:
    """The import path of `fn` that worker processes can import it by; a ConfigError saying why and what to
    do for a lambda, a nested function or one defined in __main__."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not callable(fn) or module is None or qualname is None:
        raise ConfigError(f"{where}: expected a function, got {type(fn).__name__}")
    if qualname == "<lambda>" or "<lambda>" in qualname:
        raise ConfigError(f"{where}: a lambda cannot be imported by the workers; define a function in a module "
                          f"and pass that")
    if "<locals>" in qualname:
        raise ConfigError(f"{where}: {qualname} is defined inside a function, so the workers cannot import it; "
                          f"move it to the top level of a module")
    if module == "__main__":
        raise ConfigError(f"{where}: {qualname} is defined in __main__ (the script being run), which the workers "
                          f"cannot import; move it into a module (e.g. mymodel.py) and import it from there")
    path = f"{module}:{qualname}"
    if import_object(path, where) is not fn:
        raise ConfigError(f"{where}: {path} imports as another object than the one given; pass a function "
                          f"defined at the top level of a module")
    return path


def call_user(fn: Callable, path: str, where: str, *args: object) -> object:
    """fn(*args) for a function a config names: its failure becomes a one-line ConfigError naming it."""
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function failed: say how, in one line
        raise ConfigError(f"{where}: {path}(...) raised {type(e).__name__}: {e}") from None



def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports each exported name from its module (exports: name ->
    module) on first use and keeps it: importing the package, or any module under it, loads none of them."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def lazy_dir(package: str) -> Callable[[], list[str]]:
    """A module `__dir__` for a package with lazy exports: its loaded names and its `__all__` (the lazy ones too),
    so that `dir()` and tab completion show `gearshift.launch` before its first use."""

    def __dir__() -> list[str]:
        module = sys.modules[package]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __dir__
