"""How many micro-batches' activations each stage holds at once under a schedule: the count a memory
model multiplies by a micro-batch's activation bytes (GPipe holds all of them, 1F1B at most S - s)."""

from __future__ import annotations

from gearshift.schedules.action import Op, Schedule


def peak_in_flight(schedule: Schedule) -> list[int]:
    """Per stage, the most micro-batches whose forward has run and whose backward (B, or a split one's BW) has
    not, in the order its rank runs them (what the simulator's memory peak counts; from the action lists alone)."""
    held = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    for acts in schedule.actions:
        for a in acts:
            if a.op is Op.FORWARD:
                held[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], held[a.stage])
            elif a.op.frees_activations:
                held[a.stage] -= 1
    return peak
