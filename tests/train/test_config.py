"""Job config: the example jobs load (without building their models) and build; every key is range-checked with
one line naming it, by its own section's check or by the checks across sections."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gearshift.cluster.emulate import EmulationConfig
from gearshift.comm.settings import SyncSettings
from gearshift.errors import ConfigError, UsageError
from gearshift.models.config import GPTConfig, MoEConfig
from gearshift.train.config import (
    AdaptConfig,
    ClusterConfig,
    DataConfig,
    JobConfig,
    ModelConfig,
    MoEPlacementConfig,
    OutputConfig,
    ParallelConfig,
    TrainConfig,
    check_override_spelling,
    load_config,
)
from gearshift.train.model import job_model

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_jobs_load(path):
    """Validation never builds a model: the Hugging Face example loads without transformers."""
    load_config(str(path))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_jobs_build_their_model(path):
    if path.name == "hf_gpt2.toml":
        pytest.importorskip("transformers")
    cfg = load_config(str(path))
    assert job_model(cfg).num_layers >= cfg.parallel.stages


def test_the_example_job_has_every_section_and_a_comment_per_key():
    path = EXAMPLES[0].parent / "job.toml"
    text = path.read_text()
    sections = re.findall(r"^\[(\w+)\]", text, re.M)
    assert sections == [f.name for f in dataclasses.fields(JobConfig)]
    keys = [ln for ln in text.splitlines() if re.match(r"\w+\s*=", ln)]
    assert keys and all("#" in ln for ln in keys), [ln for ln in keys if "#" not in ln]


def test_example_job_is_a_two_stage_pipeline_on_two_workers():
    """What the README promises: `gearshift train examples/job.toml` and torchrun with 2 processes."""
    cfg = load_config(str(EXAMPLES[0].parent / "job.toml"))
    assert (cfg.cluster.workers, cfg.parallel.stages, cfg.parallel.schedule) == (2, 2, "1f1b")


@pytest.mark.parametrize("override,message", [
    ("--train.batch_size=0", "train.batch_size: must be >= 1, got 0"),
    ("--train.batch_size=-8", "train.batch_size: must be >= 1, got -8"),
    ("--train.seed=-1", "train.seed: must be >= 0, got -1"),
    ("--train.beta2=1", "train.beta2: must be in [0, 1), got 1.0"),
    ("--cluster.bandwidth=fast", "cluster.bandwidth: expected a rate like 200mbit or 1gbit, got 'fast'"),
    ("--output.trace_step=300", "output.trace_step: must be -1 (the last step) or in 0..299"),
    ("--output.trace_step=-2", "output.trace_step: must be -1"),
    ("--adapt.controller=joint", "adapt.controller: joint prices the schedule with the partition, so it needs "
                                 "parallel.schedule = auto, got '1f1b'"),
    ("--adapt.detect=0.5", "adapt.detect: must be > 1 (a ratio) or 0 (off), got 0.5"),
    ("--adapt.confirm=0", "adapt.confirm: must be >= 1 (samples in a row), got 0"),
    ("--adapt.hysteresis=1", "adapt.hysteresis: must be in [0, 1), got 1"),
    ("--adapt.controller=both", "adapt.controller: 'both' (allowed: separate, joint)"),
    ("--emulate.trace=/nonexistent/t.json", "emulate.trace: no such file '/nonexistent/t.json'"),
    ("--adapt.overhead=/nonexistent/fits.json", "adapt.overhead: file not found: /nonexistent/fits.json"),
    ("--train.lr=inf", "train.lr: expected a finite number, got inf"),
    ("--cluster.timeout_s=inf", "cluster.timeout_s: expected a finite number, got inf"),
    ("--emulate.link_bandwidth=nan", "emulate.link_bandwidth: expected a finite number, got nan"),
    ("--emulate.slowdown=[1,-inf]", "emulate.slowdown[1]: expected a finite number, got -inf"),
])
def test_keys_without_a_check_before_now_have_one(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_values_that_are_allowed_still_load():
    cfg = load_config(None, ["--cluster.bandwidth=200mbit", "--output.trace_step=0", "--train.seed=7"])
    assert (cfg.cluster.bandwidth, cfg.output.trace_step, cfg.train.seed) == ("200mbit", 0, 7)


@pytest.mark.parametrize("argv,message", [
    (["--train.steps", "5"], "--train.steps: expected --train.steps=VALUE (got a space: --train.steps 5)"),
    (["job.toml", "--output.dir"], "--output.dir: expected --output.dir=VALUE"),
    (["--output.dir", "--train.steps=5"], "--output.dir: expected --output.dir=VALUE"),
])
def test_an_override_with_a_space_for_equals_is_named(argv, message):
    with pytest.raises(UsageError) as e:
        check_override_spelling(argv)
    assert str(e.value) == message


def test_options_and_well_formed_overrides_pass_the_spelling_check():
    check_override_spelling(["job.toml", "--train.steps=5", "--resume", "--out", "runs/x.json", "--stages", "2"])


def _model(name: str, **shape) -> ModelConfig:
    m = ModelConfig(name=name)
    for k, v in shape.items():
        setattr(m.gpt, k, v)
    return m


@pytest.mark.parametrize("section,message", [
    (_model("gpt", heads=3), "model.width: must be divisible by model.heads (128 % 3 != 0)"),
    (_model("moe_gpt", top_k=3), "model.top_k: 1 or 2 (got 3)"),
    (_model("gtp"), "model.name: unknown model 'gtp' (allowed: gpt, moe_gpt or 'package.module:function')"),
    (DataConfig(val_fraction=1.0), "data.val_fraction: must be in (0, 1), got 1.0"),
    (DataConfig(name="csv"), "data.name: unknown data 'csv' (allowed: bytes, text or 'package.module:function')"),
    (ClusterConfig(workers=0), "cluster.workers: must be in 1..64, got 0"),
    (ClusterConfig(workers=4, ranks_per_node=3), "cluster.ranks_per_node: must divide cluster.workers (4), got 3"),
    (ParallelConfig(schedule="zigzag"),
     "parallel.schedule: 'zigzag' (allowed: gpipe, 1f1b, kfkb, zb1p, interleaved, zbv, multidir, auto)"),
    (ParallelConfig(sync=SyncSettings(bucket_mb=0.0)), "parallel.bucket_mb: must be > 0, got 0.0"),
    (ParallelConfig(strategy="best"), "parallel.strategy: 'best' (allowed: fixed, auto)"),
    (TrainConfig(lr=3e-4, min_lr=1e-3), "train.min_lr: must be in [0, train.lr], got 0.001"),
    (OutputConfig(existing="keep"), "output.existing: 'keep' (allowed: move, refuse)"),
    (AdaptConfig(alpha=0.0), "adapt.alpha: must be in (0, 1], got 0.0"),
    (AdaptConfig(schedule_kinds=["kfkb", "zbv"]),
     "adapt.schedule_kinds: ['kfkb', 'zbv'] (allowed: a non-empty list of kfkb, zb1p)"),
    (ParallelConfig(virtual_stages=0), "parallel.virtual_stages: must be >= 1, got 0"),
    (ParallelConfig(directions=-1),
     "parallel.directions: must be >= 2 (multidir's pipelines, at most parallel.stages / 2), got -1"),
    (MoEPlacementConfig(window=-1), "moe.window: must be >= 0, got -1"),
])
def test_each_section_checks_its_own_keys(section, message):
    """A section's check needs no other section; the defaults pass it."""
    type(section)().check()
    with pytest.raises(ConfigError) as e:
        section.check()
    assert str(e.value) == message


def test_virtual_stages_cut_the_model_and_refuse_what_they_cannot_run():
    """interleaved and zbv cut the model into stages x per-rank ranges; the adaptive DP (one stage per rank) and
    split backwards under expert parallelism are refused in one line."""
    tiny = ["--model.layers=2", "--cluster.workers=2", "--parallel.stages=2"]
    cfg = load_config(None, [*tiny, "--parallel.schedule=interleaved", "--parallel.virtual_stages=2"])
    assert cfg.parallel.model_stages == 4
    with pytest.raises(ConfigError, match=r"^parallel.stages: more stages x 3 per rank \(6\) than layers \(4 "):
        load_config(None, [*tiny, "--parallel.schedule=interleaved", "--parallel.virtual_stages=3"])
    with pytest.raises(ConfigError, match="^parallel.partition: adaptive plans one stage per rank, not "
                                          "parallel.schedule = zbv"):
        load_config(None, [*tiny, "--parallel.schedule=zbv", "--parallel.partition=adaptive"])
    with pytest.raises(ConfigError, match="^parallel.partition: expected 4 ranges"):
        load_config(None, [*tiny, "--parallel.schedule=zbv", "--parallel.partition=[[0, 2], [2, 4]]"])
    with pytest.raises(ConfigError, match="^parallel.experts: expert parallelism does not apply to "
                                          "parallel.schedule = zb1p"):
        load_config(None, ["--model.name=moe_gpt", "--cluster.workers=4", "--parallel.stages=2",
                           "--parallel.experts=2", "--parallel.schedule=zb1p"])


def test_the_emulation_section_checks_against_the_workers():
    EmulationConfig().check(4)
    with pytest.raises(ConfigError, match=r"^emulate.slowdown: expected one factor per rank \(4 workers\), got 2$"):
        EmulationConfig(slowdown=[1.0, 2.0]).check(4)
    with pytest.raises(ConfigError, match=r"^emulate.slowdown: expected one factor per rank \(4 workers\), got 2$"):
        load_config(None, ["--emulate.slowdown=[1, 2]"])


def test_the_model_section_embeds_the_models_own_config():
    """[model]'s GPT keys are GPTConfig's (defaults and checks), moe_gpt's are MoEConfig's: no copy of either."""
    cfg = load_config(None, ["--model.name=moe_gpt", "--model.experts=4", "--model.layers=2"])
    assert isinstance(cfg.model.shape(), MoEConfig) and cfg.model.shape().experts == 4
    assert cfg.model.table() == {**{k: getattr(GPTConfig(layers=2), k) for k in ("layers", "width", "heads",
                                                                                    "context", "dropout")},
                                 "moe_every": 2, "experts": 4, "top_k": 2, "capacity_factor": 0.0, "aux_loss": 0.01}
    assert set(load_config(None).model.table()) == {"layers", "width", "heads", "context", "dropout"}
    with pytest.raises(ConfigError, match=r"^model.layers: must be a positive integer \(got 0\)$"):
        load_config(None, ["--model.layers=0"])


def test_cross_section_checks_stay_in_validate():
    with pytest.raises(ConfigError, match=r"^parallel.stages: must divide cluster.workers \(4 workers, 3 stages\)$"):
        load_config(None, ["--parallel.stages=3"])
    with pytest.raises(ConfigError, match=r"^data.seq_len: at most model.context \(128\), got 129$"):
        load_config(None, ["--data.seq_len=129"])
    with pytest.raises(ConfigError, match=r"^output.trace_step: must be -1 \(the last step\) or in 0..9 "):
        load_config(None, ["--train.steps=10", "--output.trace_step=10"])


def test_replicas_directions_and_the_parts_of_the_batch():
    """A replicated pipeline splits the batch over its replicas; multidir over its directions (one replica)."""
    rep = load_config(None, ["--parallel.stages=2"])
    assert (rep.replicas, rep.directions, rep.batch_parts) == (2, 1, 2)
    md = load_config(None, ["--parallel.schedule=multidir"])
    assert (md.replicas, md.directions, md.batch_parts) == (1, 2, 2)
    assert load_config(None, ["--parallel.directions=3"]).batch_parts == 1  # directions are multidir's alone


def test_validation_never_imports_a_model_given_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["--model.name=explodes_on_import:build", "--data.seq_len=16"])
    with pytest.raises(ConfigError, match=r"^model.name: importing 'explodes_on_import' raised RuntimeError"):
        job_model(cfg)  # the pre-check where the model is built (the launcher's and every worker's)


@pytest.mark.parametrize("section", ["model", "data"])
def test_a_model_or_data_module_that_does_not_exist_is_the_one_error_before_the_keys_it_decides(section):
    """No data.seq_len given (required for a model by import path): the missing module is what is said."""
    with pytest.raises(ConfigError, match=rf"^{section}.name: cannot import 'no_such_pkg.mod' for "
                                          r"'no_such_pkg.mod:build' \(no module named 'no_such_pkg'"):
        load_config(None, [f"--{section}.name=no_such_pkg.mod:build"])


def test_microbatch_size_keeps_the_size_as_replicas_change(tmp_path):
    """parallel.microbatch_size: the count follows the replicas (batch 32: 1 replica -> 8 of 4, 2 -> 4 each, 4 -> 2
    each), multidir's directions too; parallel.microbatches alone keeps the count (the size shrinks)."""
    for workers, stages, count in ((4, 4, 8), (4, 2, 4), (4, 1, 2)):
        cfg = load_config(None, [f"--cluster.workers={workers}", f"--parallel.stages={stages}",
                                 "--train.batch_size=32", "--parallel.microbatch_size=4"])
        assert cfg.parallel.microbatches == count
        assert cfg.train.batch_size // cfg.replicas // cfg.parallel.microbatches == 4
    cfg = load_config(None, ["--cluster.workers=4", "--parallel.stages=1", "--train.batch_size=32"])
    assert cfg.parallel.microbatches == 8 and cfg.parallel.microbatch_size == 0
    md = load_config(None, ["--parallel.schedule=multidir", "--train.batch_size=64", "--parallel.microbatch_size=8"])
    assert md.parallel.microbatches == 4  # 64 over 2 directions, 32 each, in micro-batches of 8
    job = tmp_path / "job.toml"
    job.write_text("[parallel]\nmicrobatches = 4\n")  # a later source's choice replaces the file's
    assert load_config(str(job), ["--parallel.microbatch_size=2"]).parallel.microbatches == 32 // 2
    job.write_text("[parallel]\nmicrobatch_size = 2\n")
    assert load_config(str(job), ["--parallel.microbatches=2"]).parallel.microbatches == 2


@pytest.mark.parametrize("args,message", [
    (["--parallel.microbatches=4", "--parallel.microbatch_size=2"],
     r"^parallel.microbatch_size: give it or parallel.microbatches, not both \(overrides give microbatches = 4 and "
     r"microbatch_size = 2\)$"),
    (["--train.batch_size=32", "--cluster.workers=4", "--parallel.stages=2", "--parallel.microbatch_size=3"],
     r"^parallel.microbatch_size: must divide the batch of each of the 2 replica\(s\) \(train.batch_size 32 / 2 = "
     r"16\), got 3$"),
    (["--parallel.microbatch_size=-1"], r"^parallel.microbatch_size: must be >= 0"),
])
def test_microbatch_size_bad_input_is_one_line(args, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, args)


def test_adapt_overhead_is_a_file_of_fits_that_measured_a_step(tmp_path):
    from gearshift.profile.overhead import StepOverhead
    from gearshift.profile.overhead_store import add_fit

    fits = tmp_path / "fits.json"
    add_fit(fits, StepOverhead(), "a run that measured nothing")
    with pytest.raises(ConfigError, match="^adapt.overhead: .* holds no fit that measured a step"):
        load_config(None, [f"--adapt.overhead={fits}"])
    add_fit(fits, StepOverhead(1.3, 4e-4, 1e-3, points=8, wake_s=0.002), "a run")
    assert load_config(None, [f"--adapt.overhead={fits}"]).adapt.overhead == str(fits)


@pytest.mark.parametrize("override, hint", [
    ("--train.stpes=5", "did you mean train.steps?"),
    ("--model.layer=3", "did you mean model.layers?"),  # a free-form section ([model]) too
    ("--train.workers=2", "did you mean cluster.workers?"),  # the key of another section
    ("--trian.steps=5", "did you mean [train]?"),
])
def test_a_mistyped_key_or_section_suggests_the_one_meant(override, hint):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).endswith(hint) and "\n" not in str(e.value), str(e.value)


def test_a_key_in_a_config_file_is_suggested_too(tmp_path):
    (tmp_path / "job.toml").write_text("[parallel]\nschedul = '1f1b'\n")
    with pytest.raises(ConfigError, match=r"^parallel.schedul: unknown key .*; did you mean parallel.schedule\?$"):
        load_config(str(tmp_path / "job.toml"), [])


def test_a_number_or_boolean_in_quotes_says_to_drop_them(tmp_path):
    """A JSON or YAML habit: the one line says what is wrong with '3e-3'; a string that is no number gets no hint."""
    hint = " (a string: drop the quotes)"
    for body, says in (('[train]\nlr = "3e-3"\n', "train.lr: expected a number, got '3e-3'" + hint),
                       ('[train]\nsteps = "10"\n', "train.steps: expected an integer, got '10'" + hint),
                       ('[output]\ntrace = "true"\n', "output.trace: expected true or false, got 'true'" + hint),
                       ('[train]\nsteps = "ten"\n', "train.steps: expected an integer, got 'ten'"),
                       ('[train]\nsteps = "true"\n', "train.steps: expected an integer, got 'true'")):
        (tmp_path / "job.toml").write_text(body)
        with pytest.raises(ConfigError) as e:
            load_config(str(tmp_path / "job.toml"), [])
        assert str(e.value) == says


def test_python_overrides_take_one_string_and_refuse_other_shapes_in_one_line():
    """load_config(path, "--train.steps=5") is the list of that one override (a str would otherwise be read a
    character at a time); a dict or a non-string is one line saying what overrides are."""
    assert load_config(None, "--train.steps=5").train.steps == 5
    for bad in ({"train.steps": 5}, ["--train.steps=5", 3]):
        with pytest.raises(ConfigError, match=r"^overrides: expected a list of '--section.key=value' strings"):
            load_config(None, bad)
