"""`gearshift export`: one consolidated state dict of a run's model from its latest checkpoint, in the model's own
names (ModelSpec.own_name: what plain PyTorch or `transformers` loads), as safetensors or a torch.save file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from gearshift.errors import DataError, UsageError
from gearshift.paths import check_output_file
from gearshift.train.checkpoint import latest_checkpoint, load_checkpoint, read_tensors
from gearshift.train.config import JobConfig, config_from_dict
from gearshift.train.model import job_model

FORMATS = ("safetensors", "torch")
EXTENSIONS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch"}  # OUT's suffix -> format


def out_format(out: str | Path, fmt: str | None = None) -> str:
    """The format to write `out` in: `fmt` if given, else the one its extension names (safetensors for any other);
    a UsageError when `fmt` contradicts a known extension (a .pt file holding safetensors would not load as one)."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} (allowed: {', '.join(FORMATS)})")
    ext = Path(out).suffix.lower()
    implied = EXTENSIONS.get(ext)
    if fmt is not None and implied is not None and fmt != implied:
        raise UsageError(f"--format: {fmt} contradicts OUT {Path(out).name} (a {ext} file is {implied}); drop --format "
                         f"or end OUT with {' or '.join(e for e, f in EXTENSIONS.items() if f == fmt)}")
    return fmt or implied or "safetensors"


def run_config(run_dir: str | Path) -> JobConfig:
    """The job a run directory holds (RUN_DIR/config.json, as it ran)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise DataError(f"export: {run_dir} is not a run directory (no config.json)")
    return config_from_dict(json.loads(path.read_text()))


def consolidated(run_dir: str | Path) -> tuple[dict[str, Tensor], Path]:
    """The model of the run's latest checkpoint in its own names, and that checkpoint's path."""
    cfg = run_config(run_dir)
    path = latest_checkpoint(run_dir)
    if path is None:
        raise DataError(f"export: no checkpoint in {Path(run_dir) / 'checkpoints'}")
    ck = load_checkpoint(path, {})
    model = ck["model"] if "model" in ck else read_tensors(path)[0]  # a DCP directory: read every layer here
    spec = job_model(cfg)
    out: dict[str, Tensor] = {}
    for name, t in model.items():
        _, i, key = name.split(".", 2)  # "layers.{i}.{key}", the runtime's global name
        out[spec.own_name(int(i), key)] = t.contiguous()
    return out, path


def export_run(run_dir: str | Path, out: str | Path, fmt: str | None = None) -> tuple[Path, int]:
    """Write the run's model to `out` in `fmt` (None: by out's extension, `out_format`); returns (the checkpoint
    exported, tensors written)."""
    fmt = out_format(out, fmt)
    if Path(out).is_dir():
        raise UsageError(f"OUT: {out} is a directory; name the file to write (e.g. {Path(out) / 'model'}"
                         f"{next(e for e, f in EXTENSIONS.items() if f == fmt)})")
    check_output_file(out, "OUT", UsageError)  # no parent is a file
    state, path = consolidated(run_dir)
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        if fmt == "safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import save_file

            try:
                save_file({k: v.clone() for k, v in state.items()}, str(out), metadata={"format": "pt"})
            except SafetensorError as e:
                raise OSError(str(e)) from None
        else:
            torch.save(state, out)
    except OSError as e:
        raise DataError(f"OUT: cannot write {out} ({e.strerror or e})") from None
    return path, len(state)
