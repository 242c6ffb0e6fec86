"""model.init: the job's weights from a file before training: a torch.save state dict, a .safetensors file, or a
local Hugging Face model directory (model.safetensors, its sharded index, or pytorch_model.bin), in the model's
own names (ModelSpec.own_name). The launcher checks the whole file against the model (built on the meta device)
before any worker starts; each rank then reads only the tensors of the layers it holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from gearshift.errors import ConfigError
from gearshift.models.meta import on_meta
from gearshift.models.spec import ModelSpec

HF_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class WeightFile:
    """The tensors of a weights file or directory by name: their shapes without reading them (safetensors), and
    each one read when asked for."""

    def __init__(self, path: str):
        self.path = path
        self._torch: dict[str, Tensor] | None = None
        self._files: dict[str, Path] = {}  # name -> the safetensors file holding it
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"model.init: {path} does not exist")
        if p.is_dir():
            found = next((p / f for f in HF_FILES if (p / f).is_file()), None)
            if found is None:
                raise ConfigError(f"model.init: {path} is a directory without {', '.join(HF_FILES)}")
            p = found
        if p.name.endswith(".index.json"):
            index = _read(p, lambda f: json.loads(f.read_text())["weight_map"])
            self._files = {k: p.parent / v for k, v in index.items()}
        elif p.suffix == ".safetensors":
            self._files = {k: p for k in _read(p, lambda f: list(_safe_keys(f)))}
        else:
            sd = _read(p, lambda f: torch.load(f, map_location="cpu", weights_only=True, mmap=True))
            if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
                raise ConfigError(f"model.init: {p} is not a state dict (a dict of tensors by name)")
            self._torch = sd

    def shapes(self) -> dict[str, tuple[int, ...]]:
        if self._torch is not None:
            return {k: tuple(v.shape) for k, v in self._torch.items()}
        from safetensors import safe_open

        out = {}
        for f in sorted(set(self._files.values())):
            with safe_open(str(f), "pt") as h:
                out.update({k: tuple(h.get_slice(k).get_shape()) for k in h.keys()})
        return out

    def get(self, names: list[str]) -> dict[str, Tensor]:
        """The tensors `names` (on the CPU)."""
        if self._torch is not None:
            return {k: self._torch[k] for k in names}
        from safetensors import safe_open

        out: dict[str, Tensor] = {}
        by_file: dict[Path, list[str]] = {}
        for k in names:
            by_file.setdefault(self._files[k], []).append(k)
        for f, ks in by_file.items():
            with safe_open(str(f), "pt", device="cpu") as h:
                out.update({k: h.get_tensor(k) for k in ks})
        return out


def _read(path: Path, fn):
    try:
        return fn(path)
    except Exception as e:  # noqa: BLE001 - any failure to parse means the file is not weights
        raise ConfigError(f"model.init: {path} is not readable as weights ({type(e).__name__}: {e})") from None


def _safe_keys(path: Path) -> Iterator[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as h:
        yield from h.keys()


def model_entries(spec: ModelSpec, seed: int, layers: list[int] | None = None) -> dict[str, tuple[int, str, tuple]]:
    """Own name -> (layer, its state-dict key, shape) of `layers` (default: all), built on the meta device."""
    out = {}
    for i in range(spec.num_layers) if layers is None else layers:
        with on_meta():
            layer = spec.layer(i, seed)
        for key, t in layer.state_dict().items():
            out[spec.own_name(i, key)] = (i, key, tuple(t.shape))
    return out


def check_init(path: str, spec: ModelSpec, seed: int) -> None:
    """The file against the whole model: every tensor names an entry of some layer with its shape, and every entry
    is there. One line for the first that is not."""
    have, want = WeightFile(path).shapes(), model_entries(spec, seed)
    for name, shape in have.items():
        if name not in want:
            raise ConfigError(f"model.init: {path}: {name!r} matches no layer of the model (its names are like "
                              f"{next(iter(want))!r})")
        if shape != want[name][2]:
            raise ConfigError(f"model.init: {path}: {name!r} has shape {list(shape)}, the model's (layer "
                              f"{want[name][0]}) is {list(want[name][2])}")
    missing = [n for n in want if n not in have]
    if missing:
        raise ConfigError(f"model.init: {path} has no {missing[0]!r} (layer {want[missing[0]][0]}; "
                          f"{len(missing)} of the model's entries missing)")


def layer_weights(path: str, spec: ModelSpec, seed: int, layers: list[int]) -> dict[str, Tensor]:
    """The weights of `layers` from the file, keyed by the runtime's global names ("layers.{i}.{key}")."""
    entries, weights = model_entries(spec, seed, layers), WeightFile(path)
    shapes = weights.shapes()
    for name, (i, _, shape) in entries.items():
        if shapes.get(name, shape) != shape or name not in shapes:
            raise ConfigError(f"model.init: {path}: {name!r} (layer {i}) is "
                              f"{'missing' if name not in shapes else f'of shape {list(shapes[name])}'}, the model's "
                              f"is {list(shape)}")
    got = weights.get(list(entries))
    return {f"layers.{i}.{key}": got[name] for name, (i, key, _) in entries.items()}


def load_init(rt, path: str, spec: ModelSpec, seed: int) -> None:
    """Load this rank's layers of `rt` (a PipelineRuntime or MultiDirRuntime) from `path`; AdamW starts fresh."""
    rt.load_state(layer_weights(path, spec, seed, sorted(rt.layers)), {})
