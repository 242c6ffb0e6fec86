"""Functions by import path: resolved from a config name, or turned into one from Python (with one-line
errors for what the workers could not import)."""

from __future__ import annotations

import os
import sys

import pytest

from gearshift.errors import ConfigError
from gearshift.imports import import_object, is_import_path, lazy_dir, lazy_exports, path_of


def test_import_object_and_its_errors():
    assert import_object("os.path:join", "model.name") is os.path.join
    assert is_import_path("a.b:c") and not is_import_path("gpt")
    for path, message in [("no_such_module_x:f", "model.name: cannot import 'no_such_module_x'"),
                          ("os.path:nope", "model.name: 'os.path' has no 'nope'"),
                          ("os:sep", "model.name: 'os:sep' is a str, not a function"),
                          (":f", "model.name: ':f' is not an import path")]:
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            import_object(path, "model.name")


def _nested():
    def inner(table):
        return table
    return inner


def test_path_of_accepts_module_functions_and_refuses_what_workers_cannot_import():
    assert path_of(os.path.join, "launch(model=...)") == f"{os.path.join.__module__}:join"
    with pytest.raises(ConfigError, match=r"^launch\(model=...\): a lambda cannot be imported"):
        path_of(lambda t: t, "launch(model=...)")
    with pytest.raises(ConfigError, match="is defined inside a function"):
        path_of(_nested(), "launch(model=...)")

    def main_fn(table):
        return table
    main_fn.__module__, main_fn.__qualname__ = "__main__", "main_fn"
    with pytest.raises(ConfigError, match=r"main_fn is defined in __main__ .* move it into a module"):
        path_of(main_fn, "launch(data=...)")


def test_lazy_exports_import_on_first_use_and_keep_the_name(monkeypatch):
    import types

    pkg = types.ModuleType("lazy_pkg_x")
    monkeypatch.setitem(sys.modules, "lazy_pkg_x", pkg)
    pkg.__getattr__ = lazy_exports("lazy_pkg_x", {"join": "os.path"})
    assert "join" not in vars(pkg)
    assert pkg.join is os.path.join and vars(pkg)["join"] is os.path.join
    with pytest.raises(AttributeError, match="module 'lazy_pkg_x' has no attribute 'split'"):
        _ = pkg.split


def test_dir_lists_lazy_exports_before_their_first_use(monkeypatch):
    """dir() (what tab completion reads) shows a lazy name before it is loaded, and does not load it."""
    import types

    pkg = types.ModuleType("lazy_pkg_y")
    monkeypatch.setitem(sys.modules, "lazy_pkg_y", pkg)
    pkg.__all__ = ["join"]
    pkg.__getattr__ = lazy_exports("lazy_pkg_y", {"join": "os.path"})
    pkg.__dir__ = lazy_dir("lazy_pkg_y")
    assert "join" in dir(pkg) and "join" not in vars(pkg)


def test_the_package_lists_its_python_api():
    import gearshift

    assert {"launch", "load_config", "JobConfig", "ModelSpec", "LayeredModel"} <= set(dir(gearshift))
