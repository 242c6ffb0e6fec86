"""Gearshift: adaptive parallel training for PyTorch on heterogeneous, shared clusters.

Python API: `load_config(path, overrides)` builds a JobConfig; `launch(cfg)` runs it on local workers
(what `gearshift train` does), `launch(cfg, model=fn, data=fn)` with your own model and data functions (at the
top level of a module, so that the workers can import them; see ModelSpec and gearshift.train.datasets);
under torchrun, `python -m gearshift.train CONFIG` runs one worker."""

from gearshift.models import LayeredModel, ModelSpec
from gearshift.train.config import JobConfig, load_config
from gearshift.train.launch import launch

__version__ = "0.1.0"
__all__ = ["JobConfig", "LayeredModel", "ModelSpec", "launch", "load_config", "__version__"]
