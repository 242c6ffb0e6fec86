"""gearshift.sim: discrete-event replay of action lists under a cost model."""

from gearshift.sim.cost import CostModel
from gearshift.sim.engine import SimResult, simulate

__all__ = ["CostModel", "SimResult", "simulate"]
