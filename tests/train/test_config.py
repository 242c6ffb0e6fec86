"""Job config: the example jobs load; every key is range-checked with one line naming it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gearshift.errors import ConfigError, UsageError
from gearshift.train.config import JobConfig, check_override_spelling, load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_jobs_load(path):
    load_config(str(path))


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
    ("--adapt.force=[[-1,[[0,2],[2,4],[4,6],[6,8]]]]", "adapt.force[0]: expected [step, [[start, end], ...]] with "
                                                      "step >= 0"),
])
def test_keys_without_a_check_before_now_have_one(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_values_that_are_allowed_still_load():
    cfg = load_config(None, ["--cluster.bandwidth=200mbit", "--output.trace_step=0", "--train.seed=7",
                             "--adapt.force=[[5,[[0,2],[2,4],[4,6],[6,8]]]]"])
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
