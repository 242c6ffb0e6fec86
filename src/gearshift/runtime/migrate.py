"""Live layer migration: move layers (parameters and AdamW state, keyed by global layer index) between
ranks to apply a new partition between optimizer steps, without restarting workers."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch.distributed as dist

from gearshift.runtime.pipeline import PipelineRuntime


@dataclass
class MigrationReport:
    moved_layers: list[int]
    bytes_moved: int  # bytes this rank received
    seconds: float


def _owner(bounds: list[tuple[int, int]], placement: list[int]) -> dict[int, int]:
    """Global layer index -> pipeline rank holding it."""
    return {i: placement[s] for s, (a, b) in enumerate(bounds) for i in range(a, b)}


def migrate(rt: PipelineRuntime, new_bounds: list[tuple[int, int]]) -> MigrationReport:
    """Apply `new_bounds` on every rank (collective: all ranks call it with the same bounds).

    Each rank packs the layers it gives away (on the CPU: rt.state(), so the object all-gather pickles host
    tensors whatever the device, NCCL included); an all-gather delivers them; each rank keeps the modules it
    still owns, builds the new ones on its device from the received state and rebuilds its optimizer with every
    layer's AdamW state. The math is unchanged: a run with a migration equals one without."""
    t0 = time.perf_counter()
    new_bounds = [tuple(b) for b in new_bounds]
    place = rt.schedule.placement
    old_owner, new_owner = _owner(rt.bounds, place), _owner(new_bounds, place)
    moved = sorted(i for i in old_owner if old_owner[i] != new_owner[i])
    model, optim = rt.state()
    outgoing = ({k: v for k, v in model.items() if int(k.split(".")[1]) in moved},
                {k: v for k, v in optim.items() if int(k.split(".")[1]) in moved})
    parcels: list = [None] * dist.get_world_size()
    dist.all_gather_object(parcels, outgoing)
    received = 0
    for r in range(rt.replica * rt.pipe_ranks, (rt.replica + 1) * rt.pipe_ranks):  # parcels from this replica's ranks
        m, o = parcels[r]
        for k, v in m.items():
            if new_owner[int(k.split(".")[1])] == rt.pipe_rank and k not in model:
                received += v.numel() * v.element_size()
            model[k] = v
        optim.update(o)
    keep = {i: mod for i, mod in rt.layers.items() if new_owner[i] == rt.pipe_rank}
    rt.set_layout(new_bounds, rt.schedule, keep)
    rt.load_state(model, optim)
    return MigrationReport(moved, received, time.perf_counter() - t0)
