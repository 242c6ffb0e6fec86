"""Profile the configured job's model on micro-batches of its own data (what planners read): at the job's
micro-batch size, or at each size a schedule choice may run (cached per model and size)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from gearshift.models.spec import ModelSpec
from gearshift.profile import LayerProfile, ModelProfile
from gearshift.profile.profiler import profile_spec
from gearshift.runtime.precision import Precision
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.env import job_device
from gearshift.train.layout import act_meta_fn


def microbatch_size(cfg: JobConfig) -> int:
    return cfg.train.batch_size // cfg.batch_parts // cfg.parallel.microbatches


def profile_job(cfg: JobConfig, repeats: int = 5, warmup: int = 2, data: JobData | None = None,
                spec: ModelSpec | None = None, size: int | None = None,
                device: torch.device | None = None) -> ModelProfile:
    """Per-layer times and bytes of the job's model for one of its micro-batches (or one of `size` samples),
    on one thread, layer by layer (each built, measured and dropped), on `device` (default: the job's,
    cluster.device); the model's keep_together becomes the profile's no_cut. Under train.precision = bf16 the
    layers run under autocast (their times and saved bytes are bf16's) and what a cut sends is priced in bf16."""
    from gearshift.train.datasets import job_data
    from gearshift.train.model import brings_own, check_job, job_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, data = spec or job_model(cfg), data or job_data(cfg)
        if brings_own(cfg):  # a model and data that do not fit: one line, not a traceback
            check_job(cfg, spec, data)
        x, y = data.sample(size or microbatch_size(cfg), cfg.train.seed)
        device = job_device(cfg) if device is None else device
        precision = Precision(cfg.train.precision)
        with precision.autocast(device):
            prof = profile_spec(spec, cfg.train.seed, x, y, repeats=repeats, warmup=warmup, device=device)
        return wire_priced(prof, precision, act_meta_fn(check_job(cfg, spec, data))) if precision.mixed else prof
    finally:
        torch.set_num_threads(threads)


def wire_priced(prof: ModelProfile, precision: Precision, act_meta) -> ModelProfile:
    """`prof` with each layer's output bytes per sample as they cross a cut (`precision.wire_meta` of the next
    layer's input, `act_meta(layer, batch)`) and its dtype named."""
    layers = list(prof.layers)
    for i in range(len(layers) - 1):
        shape, dtype = precision.wire_meta(act_meta(i + 1, 1))
        layers[i] = replace(layers[i], activation_bytes=math.prod(shape) * dtype.itemsize)
    return replace(prof, layers=layers, dtype="bfloat16" if precision.mixed else prof.dtype)


def profile_sizes(cfg: JobConfig, sizes: list[int], cache: str = "", passes: int = 1, repeats: int = 3,
                  warmup: int = 1, data: JobData | None = None,
                  spec: ModelSpec | None = None, device: torch.device | None = None) -> dict[int, ModelProfile]:
    """The job's model profiled at each micro-batch size on `device` (default: the job's), once: read from the
    `cache` directory when a profile of this model on that kind of device at that size is there, else measured
    (per layer, the fastest of `passes` passes: a shared machine only ever adds time) and written there."""
    from gearshift.train.datasets import job_data
    from gearshift.train.model import job_model

    spec, data = spec or job_model(cfg), data or job_data(cfg)
    device = job_device(cfg) if device is None else device
    out, paths = {}, {}
    for size in sorted(set(sizes)):
        paths[size] = Path(cache) / f"profile-{model_key(cfg, device)}-mb{size}.json" if cache else None
        if paths[size] is not None and paths[size].is_file():
            out[size] = ModelProfile.load(paths[size])
    todo = [size for size in paths if size not in out]
    runs: dict[int, list[ModelProfile]] = {size: [] for size in todo}
    for _ in range(passes):  # pass by pass over the sizes: a burst of other load lands on one pass of each
        for size in todo:
            runs[size].append(profile_job(cfg, repeats, warmup, data, spec, size, device))
    for size in todo:
        out[size] = fastest_layers(runs[size])
        if paths[size] is not None:
            paths[size].parent.mkdir(parents=True, exist_ok=True)
            tmp = paths[size].with_suffix(".tmp")
            out[size].save(tmp)
            tmp.replace(paths[size])
    return out


_TIMES = ("forward_s", "backward_s", "forward_split_s", "step_s")  # the split's forward: < 0 = unmeasured


def fastest_layers(runs: list[ModelProfile]) -> ModelProfile:
    """One profile from several passes of the same model: each layer's fastest forward, backward, split backward's
    forward and update (a shared machine only ever adds time), and its BI and BW from the pass whose BI + BW is the
    fastest (as its backward is the fastest pass's whole: the minima of the two parts taken from different passes
    would price a split backward below any pass's, and favour it over the whole); meta["passes"] says how many."""
    def fastest(lps: tuple[LayerProfile, ...]) -> LayerProfile:
        split = min(lps, key=lambda lp: lp.backward_input_s + lp.backward_weight_s)  # BI, BW < 0: unmeasured
        return replace(lps[0], **{k: min(getattr(lp, k) for lp in lps) for k in _TIMES},
                       backward_input_s=split.backward_input_s, backward_weight_s=split.backward_weight_s)

    layers = [fastest(lps) for lps in zip(*(r.layers for r in runs))]
    return replace(runs[0], layers=layers, meta={**runs[0].meta, "passes": len(runs)})


def model_key(cfg: JobConfig, device: torch.device | None = None) -> str:
    """A short digest of what a profile depends on: the model, the shape of its samples, the kind of device."""
    what = {"device": (device or torch.device("cpu")).type, "model": cfg.model.name, "table": cfg.model.table(),
            "data": cfg.data.name, "seq_len": cfg.data.seq_len,
            "data_table": cfg.data.table() if cfg.data.name not in ("bytes", "text") else {},
            "torch": torch.__version__, "precision": cfg.train.precision}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]
