"""gearshift.sim: discrete-event replay of action lists under a cost model."""

from gearshift.sim.cost import ScheduleCosts
from gearshift.sim.engine import SimResult, simulate

__all__ = ["ScheduleCosts", "SimResult", "simulate"]
