"""Gearshift: adaptive parallel training for PyTorch on heterogeneous, shared clusters.

Python API: `load_config(path, overrides)` builds a JobConfig; `launch(cfg)` runs it on local workers
(what `gearshift train` does), `launch(cfg, model=fn, data=fn)` with your own model and data functions (at the
top level of a module, so that the workers can import them; see ModelSpec and gearshift.train.datasets);
under torchrun, `python -m gearshift.train CONFIG` runs one worker.

The names load on first use: importing a package below (gearshift.schedules, gearshift.sim, ...) runs this
file first, and must not load the training stack (torch, comm, runtime) with it."""

from gearshift.imports import lazy_dir, lazy_exports

__version__ = "0.1.0"
__all__ = ["JobConfig", "LayeredModel", "ModelSpec", "launch", "load_config", "__version__"]
__getattr__ = lazy_exports(__name__, {
    "JobConfig": "gearshift.train.config", "load_config": "gearshift.train.config",
    "launch": "gearshift.train.launch", "LayeredModel": "gearshift.models", "ModelSpec": "gearshift.models",
})
__dir__ = lazy_dir(__name__)
