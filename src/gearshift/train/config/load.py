"""A JobConfig from the defaults (the sections' dataclasses: the job `gearshift train` runs without a config
file), a TOML file and `--section.key=value` overrides, validated; and back from `to_dict()`."""

from __future__ import annotations

from gearshift.errors import ConfigError
from gearshift.tomlfile import read_toml
from gearshift.train.config.job import JobConfig, validate
from gearshift.train.config.tables import apply, parse_override


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] | str = (),
                base: dict | None = None) -> JobConfig:
    """Defaults (or `base`, a job's to_dict()) <- the job file at `path` (none: the defaults are the job) <-
    `--section.key=value` overrides (one such string alone reads as a list of it)."""
    given = overrides
    overrides = [overrides] if isinstance(overrides, str) else [] if isinstance(overrides, dict) else list(overrides)
    if isinstance(given, dict) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides: expected a list of '--section.key=value' strings (e.g. ['--train.steps=50']), "
                          f"got {type(given).__name__} {given!r}"[:200])
    cfg = config_from_dict(base) if base is not None else JobConfig()
    if path is not None:
        _apply(cfg, read_toml(path, "config", ConfigError), str(path))
    nested: dict[str, dict] = {}
    for arg in overrides:
        sec, name, value = parse_override(arg)
        nested.setdefault(sec, {})[name] = value
    _apply(cfg, nested, "override")
    return validate(cfg)


def _apply(cfg: JobConfig, tables: dict, origin: str) -> None:
    """apply(), and parallel.microbatches against parallel.microbatch_size: one source (the file, the overrides)
    gives one of them; a later source's choice replaces an earlier one's."""
    par = tables.get("parallel")
    given = {"microbatches", "microbatch_size"} & set(par) if isinstance(par, dict) else set()
    if len(given) == 2 and par["microbatch_size"] != 0:
        where = "overrides" if origin == "override" else origin
        raise ConfigError(f"parallel.microbatch_size: give it or parallel.microbatches, not both ({where} give "
                          f"microbatches = {par['microbatches']} and microbatch_size = {par['microbatch_size']})")
    apply(cfg, tables, origin)
    if given == {"microbatches"}:
        cfg.parallel.microbatch_size = 0


def config_from_dict(d: dict) -> JobConfig:
    """Rebuild a JobConfig from `to_dict()` output (how the launcher hands it to workers)."""
    cfg = JobConfig()
    apply(cfg, d, "config")
    return cfg
