"""Live layer migration: move layers (parameters and AdamW state, keyed by global layer index) between
ranks to apply a new partition between optimizer steps, without restarting workers.

Only what moves travels, and only to the rank that takes it: each (giver, taker) pair of a replica exchanges one
size message and one flat byte buffer (every moved tensor's bytes, with a small pickled header naming them),
point to point. The layers a rank keeps stay where they are, their AdamW state handed to the new optimizer as it
is (no copy, no reload). An object all-gather of every rank's state to every rank (pickling and unpickling each
tensor on each rank) cost several times the bytes' own transfer on a shared host. A MoE runtime (expert
parallelism: experts split across ranks) keeps the all-gather, whose parcels carry only the experts each rank holds."""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from gearshift.runtime.pipeline import PipelineRuntime

SIZE_TAG, DATA_TAG = 7001, 7002  # the two messages of a pair (no pipeline traffic is in flight between steps)


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

    Each rank sends the layers it gives away (their state_dict and their parameters' AdamW state) to their new
    owner, keeps the modules it still owns with their optimizer state, builds the new ones on its device and
    loads what it received. The math is unchanged: a run with a migration equals one without."""
    t0 = time.perf_counter()
    new_bounds = [tuple(b) for b in new_bounds]
    place = rt.schedule.placement
    old_owner, new_owner = _owner(rt.bounds, place), _owner(new_bounds, place)
    moved = sorted(i for i in old_owner if old_owner[i] != new_owner[i])
    if rt.experts is not None:
        return _migrate_gathered(rt, new_bounds, moved, new_owner, t0)
    me, base = rt.pipe_rank, rt.replica * rt.pipe_ranks
    # what this rank gives, by taker: (kind, global name, state key, tensor); read before the layout changes
    giving: dict[int, list[tuple[str, str, str, Tensor]]] = {}
    params = dict(rt.named_parameters())
    for i in moved:
        if old_owner[i] != me:
            continue
        out = giving.setdefault(new_owner[i], [])
        out += [("m", f"layers.{i}.{n}", "", t.detach()) for n, t in rt.layers[i].state_dict().items()]
        for n, _ in rt.layers[i].named_parameters():
            st = rt.optimizer.state.get(params[f"layers.{i}.{n}"]) or {}
            out += [("o", f"layers.{i}.{n}", k, v.detach() if torch.is_tensor(v) else torch.tensor(v))
                    for k, v in st.items()]
    takes_from = sorted({old_owner[i] for i in moved if new_owner[i] == me})
    keep = {i: mod for i, mod in rt.layers.items() if new_owner[i] == me}
    kept_state = {p: rt.optimizer.state[p] for mod in keep.values() for p in mod.parameters()
                  if p in rt.optimizer.state}
    bodies = {dst: _pack(entries, rt.device) for dst, entries in giving.items()}
    got = _exchange(bodies, takes_from, base, rt.device)
    rt.set_layout(new_bounds, rt.schedule, keep)  # modules kept as they are, the taken ones built; a new optimizer
    for p, st in kept_state.items():
        rt.optimizer.state[p] = st
    params = dict(rt.named_parameters())
    received = 0
    model: dict[int, dict[str, Tensor]] = {}
    for buf in got:
        received += buf.numel()
        for kind, name, key, t in _unpack(buf):
            if kind == "m":
                i, rest = name.split(".", 2)[1:]
                model.setdefault(int(i), {})[rest] = t
            else:
                p = params[name]
                rt.optimizer.state.setdefault(p, {})[key] = t.to("cpu" if key == "step" else p.device)
    for i, sd in model.items():
        rt.layers[i].load_state_dict(sd)
    return MigrationReport(moved, received, time.perf_counter() - t0)


def _pack(entries: list[tuple[str, str, str, Tensor]], device: torch.device) -> Tensor:
    """One uint8 buffer on `device`: an 8-byte header length, the pickled header (each tensor's kind, name, key,
    dtype, shape and byte count), then every tensor's bytes in order."""
    head = pickle.dumps([(k, n, s, t.dtype, tuple(t.shape), t.numel() * t.element_size()) for k, n, s, t in entries])
    parts = [torch.tensor([len(head)], dtype=torch.int64, device=device).view(torch.uint8),
             torch.frombuffer(bytearray(head), dtype=torch.uint8).to(device)]
    parts += [t.to(device).contiguous().reshape(-1).view(torch.uint8) for *_, t in entries]
    return torch.cat(parts)


def _unpack(buf: Tensor) -> list[tuple[str, str, str, Tensor]]:
    """The tensors of a _pack buffer (each its own copy, of its own dtype and shape, on the buffer's device)."""
    n = int(buf[:8].cpu().view(torch.int64))
    head = pickle.loads(buf[8:8 + n].cpu().numpy().tobytes())
    off, out = 8 + n, []
    for kind, name, key, dtype, shape, nbytes in head:
        out.append((kind, name, key, buf[off:off + nbytes].clone().view(dtype).reshape(shape)))
        off += nbytes
    return out


def _exchange(bodies: dict[int, Tensor], takes_from: list[int], base: int, device: torch.device) -> list[Tensor]:
    """Send each body to its pipeline rank and receive one from each of `takes_from` (ranks of the replica that
    starts at global rank `base`): the sizes first, then the buffers, every send posted before any wait."""
    sizes = {dst: torch.tensor([b.numel()], dtype=torch.int64, device=device) for dst, b in bodies.items()}
    want = {src: torch.zeros(1, dtype=torch.int64, device=device) for src in takes_from}
    _wait([dist.isend(t, base + dst, tag=SIZE_TAG) for dst, t in sizes.items()]
          + [dist.irecv(t, base + src, tag=SIZE_TAG) for src, t in want.items()])
    got = {src: torch.empty(int(t.item()), dtype=torch.uint8, device=device) for src, t in want.items()}
    _wait([dist.isend(b, base + dst, tag=DATA_TAG) for dst, b in bodies.items()]
          + [dist.irecv(t, base + src, tag=DATA_TAG) for src, t in got.items()])
    return [got[s] for s in takes_from]


def _wait(reqs: list) -> None:
    for r in reqs:
        r.wait()


def _migrate_gathered(rt: PipelineRuntime, new_bounds: list[tuple[int, int]], moved: list[int],
                      new_owner: dict[int, int], t0: float) -> MigrationReport:
    """The expert-parallel path: each rank packs the layers it gives away (on the CPU: rt.state(), so the object
    all-gather pickles host tensors whatever the device, NCCL included); an all-gather delivers them; each rank keeps
    the modules it still owns, builds the new ones and rebuilds its optimizer with every layer's AdamW state."""
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
