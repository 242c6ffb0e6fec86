"""RUN_DIR/run.json: what the run's data and model say about its numbers, which metrics.jsonl and config.json do
not hold: what tokens/s counts (tokens, or samples where a sample is one), the loss's unit (nats for the
built-in models; a model's own loss function says nothing) and the corpus's unigram entropy (the loss of a model
that ignores context, where the data has one). Written by the run's rank 0; read by the report and the plots."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FILE = "run.json"
BUILT_IN_MODELS = ("gpt", "moe_gpt")  # as train.config names them: their loss is cross-entropy in nats
BUILT_IN_DATA = ("bytes", "text")  # byte corpora: a token is a byte


@dataclass
class RunInfo:
    """The units of a run's numbers (see the module)."""

    throughput_unit: str = "tokens"  # "tokens" or "samples": what metrics.jsonl's tokens_per_s counts
    tokens_per_sample: int = 1
    loss_unit: str | None = "nats"  # None: the model's own loss function, unit unknown
    unigram_entropy: float | None = None

    @property
    def rate(self) -> str:
        """The throughput's unit: "tokens/s" or "samples/s"."""
        return f"{self.throughput_unit}/s"

    @property
    def loss_label(self) -> str:
        """The loss's axis and row label: "loss (nats)", or "loss (the model's loss function)"."""
        return f"loss ({self.loss_unit})" if self.loss_unit else "loss (the model's loss function)"

    @classmethod
    def of_job(cls, model_name: str, tokens_per_sample: int, unigram_entropy: float | None) -> RunInfo:
        """A job's: tokens where a sample holds more than one (a sequence), else samples."""
        return cls("tokens" if tokens_per_sample > 1 else "samples", tokens_per_sample,
                   "nats" if model_name in BUILT_IN_MODELS else None, unigram_entropy)

    @classmethod
    def from_config(cls, config: dict | None) -> RunInfo:
        """A run without run.json (an older run): what its config.json tells (a byte corpus counts tokens, a built-in
        model's loss is in nats; else samples and the model's own loss); the defaults without a config."""
        if not config:
            return cls()
        model = (config.get("model") or {}).get("name", "gpt")
        data = (config.get("data") or {}).get("name", "bytes")
        return cls("tokens" if data in BUILT_IN_DATA else "samples", 1,
                   "nats" if model in BUILT_IN_MODELS else None, None)

    def write(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / FILE
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path


def read_run_info(run_dir: str | Path, config: dict | None = None) -> RunInfo:
    """RUN_DIR/run.json, or what config.json tells where the run has none (or an unreadable one)."""
    path = Path(run_dir) / FILE
    try:
        d = json.loads(path.read_text())
        return RunInfo(**{k: d[k] for k in ("throughput_unit", "tokens_per_sample", "loss_unit", "unigram_entropy")
                          if k in d})
    except (OSError, ValueError, TypeError):
        return RunInfo.from_config(config)
