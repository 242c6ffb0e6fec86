"""Rank 0's live view: a rich progress bar with loss and tokens/s (samples/s where a sample is one token), and the
final summary table."""

from __future__ import annotations

import rich.progress as rp
from rich.console import Console
from rich.table import Table

from gearshift.report.records import StepMetrics
from gearshift.train.config import BUILT_IN_MODELS, JobConfig
from gearshift.words import plural


class Progress:
    """A progress bar over training steps; does nothing when disabled (other ranks, tests)."""

    def __init__(self, total: int, start: int, enabled: bool, rate: str = "tok/s"):
        self.bar, self.rate = None, rate  # rate: the throughput's unit (tok/s, or samples/s for one per sample)
        if enabled:
            self.bar = rp.Progress(
                rp.TextColumn("[bold]train"), rp.BarColumn(), rp.MofNCompleteColumn(),
                rp.TextColumn("{task.fields[info]}"), rp.TimeRemainingColumn(), transient=False,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, step: int, rec: StepMetrics) -> None:
        if self.bar is None:
            return
        info = f"loss {rec.loss:.3f}  {rec.tokens_per_s:,.0f} {self.rate}  bubble {rec.bubble_fraction:.0%}"
        if rec.val_loss is not None:
            info += f"  val {rec.val_loss:.3f}"
        self.bar.update(self.task, completed=step + 1, info=info)

    def note(self, text: str) -> None:
        """A line printed above the bar (re-planning decisions, evaluations)."""
        if self.bar is not None:
            self.bar.console.print(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def schedule_runs_text(runs: list[dict], most: int = 6) -> str:
    """Which (m, K) ran from which step (and the stages recomputing, where any); past `most` runs, the first two
    and the last two (metrics.jsonl holds every decision)."""
    parts = [f"m={r['m']} K={r['k']}"
             + (f" recomputing {','.join(map(str, r['recompute']))}" if r.get("recompute") else "")
             + f" from step {r['from_step']}" for r in runs]
    if len(parts) > most:
        parts = parts[:2] + [f"... {len(parts) - 4} more ..."] + parts[-2:]
    return "; ".join(parts)


def steps_text(s: dict) -> str:
    """The steps this run ran: from where it started to where it ended, and train.steps when it stopped short."""
    end = s.get("end_step", s["steps"])
    short = f" (of {s['steps']}; --resume continues)" if end < s["steps"] else ""
    return f"{s['start_step']} -> {end}{short} in {s['wall_s']:.1f} s"


def job_line(cfg: JobConfig, schedule_runs: list[dict] | None = None) -> str:
    """The job's shape in words: workers, stages x replicas (or multidir's directions), the schedule and its
    micro-batches (or what ran from which step, where the schedule switched)."""
    p = cfg.parallel
    mbs = plural(p.microbatches, "micro-batch", "micro-batches")
    workers = plural(cfg.cluster.workers, "worker")
    if p.schedule == "multidir":
        return (f"{workers}, multidir: {p.directions} directions over {plural(p.stages, 'stage')}, "
                f"update {p.update}, {mbs} per direction")
    if schedule_runs:  # auto or forced switches: what ran from which step
        what = f"{p.schedule} schedule ({schedule_runs_text(schedule_runs)})"
    else:
        what = f"{p.schedule}{'' if p.schedule != 'kfkb' else f' K={p.k}'}, {mbs}"
    return f"{workers}, {plural(p.stages, 'stage')} x {plural(cfg.replicas, 'replica')}, {what}"


def print_summary(cfg: JobConfig, s: dict) -> None:
    """The end-of-run table: losses (against the corpus's unigram entropy, where the data has one),
    throughput, bubbles."""
    t = Table(title="Gearshift run summary", show_header=False)
    t.add_row("job", job_line(cfg, s.get("schedule_runs")))
    t.add_row("steps", steps_text(s))
    unit = " nats" if cfg.model.name in BUILT_IN_MODELS else ""  # a custom model's loss is whatever its loss_fn gives
    t.add_row("train loss", f"{s['first_loss']:.3f} -> {s['final_loss']:.3f}{unit}")
    if s.get("val_loss") is not None:
        t.add_row("validation loss", f"{s['val_loss']:.3f}{unit}")
    if s.get("unigram_entropy") is not None:  # only byte corpora (and data that define it) can say
        t.add_row("unigram entropy", f"{s['unigram_entropy']:.3f} nats (a model that ignores context)")
    t.add_row("throughput", f"{s['tokens_per_s']:,.0f} {s.get('throughput_unit', 'tokens')}/s (median)")
    t.add_row("bubble fraction", f"{s['bubble_fraction']:.1%} (median, measured)")
    if "placement_decisions" in s:
        t.add_row("expert placement", f"moved at {s['placement_switches']} of {s['placement_decisions']} decisions "
                                      f"(every {cfg.moe.every} steps)")
    if s.get("peak_act_bytes"):
        t.add_row("activations", "peak saved for backward per rank: "
                  + " / ".join(f"{b / 2**20:.1f}" for b in s["peak_act_bytes"]) + " MiB")
    t.add_row("output", cfg.output.dir)
    if s.get("report"):
        t.add_row("report", f"{s['report']} (open in a browser)")
    Console().print(t)
