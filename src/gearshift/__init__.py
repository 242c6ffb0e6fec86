"""Gearshift: adaptive parallel training for PyTorch on heterogeneous, shared clusters.

Python API: `load_config(path, overrides)` builds a JobConfig; `launch(cfg)` runs it on local workers
(what `gearshift train` does); under torchrun, `python -m gearshift.train CONFIG` runs one worker."""

from gearshift.train.config import JobConfig, load_config
from gearshift.train.launch import launch

__version__ = "0.1.0"
__all__ = ["JobConfig", "launch", "load_config", "__version__"]
