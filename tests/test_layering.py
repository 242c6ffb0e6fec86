"""The import structure docs/architecture.md promises, checked in fresh interpreters (this one has loaded
everything already): pure planning loads no torch, the package root loads on first use, and the registries
that replaced import cycles are filled by importing any module of their package."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.subprocess  # a fresh interpreter per test

def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pure_planning_loads_no_torch_and_nothing_above_it():
    loaded = _run("""
        import sys
        import gearshift.schedules, gearshift.sim, gearshift.sim.collectives, gearshift.planner
        import gearshift.planner.strategy, gearshift.planner.schedule_choice, gearshift.planner.replay
        print(" ".join(sorted(sys.modules)))
    """).split()
    heavy = ("torch", "gearshift.models", "gearshift.profile.profiler", "gearshift.comm", "gearshift.runtime",
             "gearshift.train", "gearshift.cli")
    assert "gearshift.planner.strategy" in loaded
    assert [m for m in loaded if m.split(".")[0] == "torch" or m.startswith(heavy)] == []


def test_the_root_loads_its_api_on_first_use_and_registries_fill_from_any_module_of_their_package():
    # one interpreter for both (each loads torch): the root first, before anything has loaded its names
    out = _run("""
        import sys
        import gearshift
        print("torch" in sys.modules, "gearshift.models" in sys.modules, "gearshift.train.launch" in sys.modules)
        from gearshift.models.spec import resolve_model
        from gearshift.schedules.generators import make_schedule
        from gearshift.schedules.validate import validate
        spec = resolve_model("moe_gpt", {"context": 8, "layers": 2, "width": 16, "heads": 2, "experts": 2}, 0)
        sch = make_schedule("multidir", 4, 4, directions=2, update="async")
        validate(sch)
        print(spec.num_layers, sch.name, sch.window)
        from gearshift import JobConfig, LayeredModel, ModelSpec, launch, load_config
        import gearshift.models, gearshift.train.config, gearshift.train.launch
        print(launch is gearshift.train.launch.launch, load_config is gearshift.train.config.load_config,
              JobConfig is gearshift.train.config.JobConfig, ModelSpec is gearshift.models.ModelSpec,
              LayeredModel is gearshift.models.LayeredModel)
        try:
            gearshift.no_such_name
        except AttributeError as e:
            print(e)
    """).splitlines()
    assert out == ["False False False", "5 multidir True", "True True True True True",
                   "module 'gearshift' has no attribute 'no_such_name'"]
