"""Gearshift: adaptive parallel training for PyTorch on heterogeneous, shared clusters."""

__version__ = "0.1.0"
