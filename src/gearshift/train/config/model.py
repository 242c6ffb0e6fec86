"""The [model] and [data] sections: a built-in name and its keys, or a function by import path with free-form
keys passed to it. [model] embeds MoEConfig (the GPT's shape plus the experts), so the built-ins' keys, defaults
and checks are the models' own."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gearshift.errors import ConfigError
from gearshift.imports import check_findable, is_import_path
from gearshift.keys import key, key_names
from gearshift.models.config import GPTConfig, MoEConfig
from gearshift.train.config.fields import embed

BUILT_IN_MODELS = ("gpt", "moe_gpt")
DATA_NAMES = ("bytes", "text")
MOE_KEYS = tuple(k for k in key_names(MoEConfig) if k not in key_names(GPTConfig))  # [model] keys of moe_gpt alone


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class ModelConfig:
    """The model: the built-in byte-level GPT (vocabulary 256), or any layered model by import path."""

    ALWAYS_KEYS: ClassVar[tuple[str, ...]] = ("init",)  # keys of [model] whatever the model (not passed to it)

    name: str = key("gpt", 'gpt (the built-in byte-level GPT), moe_gpt (the GPT with mixture-of-experts blocks) or '
                           '"package.module:function", called with the [model] table as a dict, returning a '
                           "ModelSpec, a LayeredModel or (nn.Sequential, loss_fn)")
    gpt: MoEConfig = embed(MoEConfig)
    options: dict[str, Any] = key({}, "model.KEY = value for any other KEY: passed to a model given by import path")
    init: str = key("", 'weights to start from: a torch.save state dict, a .safetensors file or a local Hugging Face '
                        'model directory, in the model\'s own names (each rank reads its layers); "" = the '
                        "model's own initialisation (a resumed run starts from its checkpoint)")

    def table(self) -> dict[str, Any]:
        """The [model] table without `name`: what the model function (or the GPT) is built from. A built-in's keys
        (the MoE keys only for moe_gpt), else the free-form keys (the GPT's keys are then unused)."""
        if is_import_path(self.name):
            return copy.deepcopy(self.options)
        keys = key_names(MoEConfig if self.name == "moe_gpt" else GPTConfig)
        return {k: getattr(self.gpt, k) for k in keys}

    def shape(self) -> GPTConfig | MoEConfig | None:
        """The built-in model's config (checked: a ConfigError names the field); None for a model by import path."""
        if is_import_path(self.name):
            return None
        return (MoEConfig if self.name == "moe_gpt" else GPTConfig)(**self.table())

    def layer_info(self) -> tuple[int, str, list[int]] | None:
        """A built-in model's number of layers, what they are (for messages) and the boundaries it must not be cut
        at; None for a model by import path (known once it is built: train.build.job_model)."""
        shape = self.shape()
        if shape is None:
            return None
        what = "= embedding + blocks + MoE blocks + head" if self.name == "moe_gpt" else \
            "= model.layers + embedding + head"
        return shape.num_layers, what, []

    def check(self) -> None:
        """The name, moe_gpt's keys set only for moe_gpt, and a built-in's shape (a model by import path: its top
        package found, not imported; it is imported and checked where it is built)."""
        check(not self.init or Path(self.init).exists(), f"model.init: {self.init} does not exist")
        if is_import_path(self.name):
            check_findable(self.name, "model.name")
            return
        check(self.name in BUILT_IN_MODELS, f"model.name: unknown model {self.name!r} (allowed: "
                                            f"{', '.join(BUILT_IN_MODELS)} or 'package.module:function')")
        moe = sorted(given(self) & set(MOE_KEYS))
        check(self.name == "moe_gpt" or not moe,
              f"model.{moe[0] if moe else ''}: a key of model.name = \"moe_gpt\" (the model is {self.name!r})")
        self.shape()


@dataclass
class DataConfig:
    """The data: a byte corpus, or any dataset by import path."""

    name: str = key("bytes", "bytes (this Python's standard library sources, or data.path), text (data.path: a file "
                             'or folder, as bytes) or "package.module:function", called with the [data] table as a '
                             "dict, returning a dataset (see gearshift.train.datasets)")
    path: str = key("", 'bytes, text: text file or directory of files, read as bytes; "" = this Python\'s standard '
                        "library sources (bytes only)")
    val_fraction: float = key(0.05, "bytes, text: last fraction of the corpus held out for validation, in (0, 1)")
    max_bytes: int = key(8_000_000, "bytes, text: read at most this many bytes of the corpus")
    seq_len: int = key(0, "bytes, text: bytes per sample; 0 = model.context (the GPT's)")
    options: dict[str, Any] = key({}, "data.KEY = value for any other KEY: passed to a dataset given by import path")

    def table(self) -> dict[str, Any]:
        """The [data] table without `name`: what the dataset function is called with."""
        if is_import_path(self.name):
            return copy.deepcopy(self.options)
        return {k: getattr(self, k) for k in key_names(DataConfig) if k not in ("name", "options")}

    def check(self) -> None:
        """A built-in corpus: its name, path and ranges (a dataset by import path is checked against the model
        before the workers start)."""
        if is_import_path(self.name):
            check_findable(self.name, "data.name")
            return
        check(self.name in DATA_NAMES,
              f"data.name: unknown data {self.name!r} (allowed: {', '.join(DATA_NAMES)} or 'package.module:function')")
        check(self.name != "text" or bool(self.path), 'data.path: required for data.name = "text" (a text file or a '
                                                      "folder)")
        if self.path:
            _check_corpus(self.path)
        check(0 < self.val_fraction < 1, f"data.val_fraction: must be in (0, 1), got {self.val_fraction}")
        check(self.max_bytes >= 1024, f"data.max_bytes: must be >= 1024, got {self.max_bytes}")
        check(self.seq_len >= 0, f"data.seq_len: must be >= 0 (0 = model.context), got {self.seq_len}")


def given(section: ModelConfig | DataConfig) -> set[str]:
    """The keys of [model] or [data] that a config file or override set (kept beside the dataclass fields:
    validation refuses moe_gpt's keys set for another model)."""
    return section.__dict__.setdefault("_given", set())


def _check_corpus(path: str) -> None:
    """data.path names a non-empty file, or a directory with a file in it (what the workers will read)."""
    p = Path(path).expanduser()
    check(p.exists(), f"data.path: no such file or directory: {path}")
    if p.is_dir():
        check(any(f.is_file() for f in p.rglob("*")), f"data.path: directory {path} holds no files")
    else:
        check(p.stat().st_size > 0, f"data.path: file {path} is empty")
