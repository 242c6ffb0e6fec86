"""model.init and `gearshift export`: weights loaded into a 2-stage pipeline (each rank its own layers), trained 0
steps and exported give back the same tensors, as safetensors and as a torch.save file; a file that does not fit
the model is one line naming the entry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gearshift.cli.main import main as cli_main
from gearshift.errors import ConfigError
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, job_model
from gearshift.train.checkpoint import Checkpointer
from gearshift.train.config import load_config
from gearshift.train.export import out_format
from gearshift.train.init_weights import check_init, load_init
from gearshift.train.rundir import write_config

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--parallel.microbatches=2", "--cluster.workers=2", "--parallel.stages=2",
        "--output.report=false"]


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """The tiny GPT as another seed initialises it: weights the job's own seed would not give."""
    return job_model(load_config(None, TINY)).model(seed).state_dict()


def _load_and_save(rank: int, world: int, args: list[str]) -> list[int]:
    cfg = load_config(None, args)
    if rank == 0:
        write_config(cfg)
    rt = build_runtime(cfg)
    load_init(rt, cfg.model.init, job_model(cfg), cfg.train.seed)
    Checkpointer(cfg).save(rt, 0)  # 0 steps
    return sorted(rt.layers)


@pytest.mark.multiprocess
def test_init_then_export_gives_back_the_same_tensors(tmp_path: Path) -> None:
    ref = _weights(seed=7)
    st, pt = tmp_path / "init.safetensors", tmp_path / "init.pt"
    save_file({k: v.contiguous() for k, v in ref.items()}, str(st))
    torch.save(ref, pt)
    run = tmp_path / "run"
    run.mkdir()
    held = spawn(_load_and_save, 2, [*TINY, f"--model.init={st}", f"--output.dir={run}"])
    assert held == [[0, 1], [2, 3]]  # each rank built (and loaded) only its own layers
    assert cli_main(["export", str(run), str(tmp_path / "out.safetensors")]) == 0
    assert cli_main(["export", str(run), str(tmp_path / "out.pt")]) == 0  # torch, as the extension says
    assert cli_main(["export", str(run), str(tmp_path / "out.weights"), "--format", "torch"]) == 0
    own = job_model(load_config(None, TINY)).model(0).state_dict()
    for got in (load_file(str(tmp_path / "out.safetensors")), torch.load(tmp_path / "out.pt", weights_only=True),
                torch.load(tmp_path / "out.weights", weights_only=True)):
        assert set(got) == set(ref)
        for k, v in ref.items():
            assert torch.equal(got[k], v), k
        assert any(not torch.equal(got[k], own[k]) for k in own)  # not the job's own initialisation
    check_init(str(pt), job_model(load_config(None, TINY)), 0)  # a torch.save file fits too


def test_a_file_that_does_not_fit_is_one_line(tmp_path: Path, capsys) -> None:
    spec, ref = job_model(load_config(None, TINY)), _weights(seed=0)
    cases = {
        "extra": ({**ref, "layers.9.w": torch.zeros(2)}, "'layers.9.w' matches no layer of the model"),
        "shape": ({**ref, "layers.1.attn.qkv.weight": torch.zeros(3, 3)},
                  "'layers.1.attn.qkv.weight' has shape [3, 3], the model's (layer 1) is [96, 32]"),
        "missing": ({k: v for k, v in ref.items() if k != "layers.3.lm_head.weight"},
                    "has no 'layers.3.lm_head.weight'"),
    }
    for name, (sd, says) in cases.items():
        torch.save(sd, tmp_path / f"{name}.pt")
        with pytest.raises(ConfigError) as e:
            check_init(str(tmp_path / f"{name}.pt"), spec, 0)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="model.init: /nonexistent.pt does not exist"):
        load_config(None, [*TINY, "--model.init=/nonexistent.pt"])
    assert cli_main(["export", str(tmp_path), str(tmp_path / "x.safetensors")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_export_format_by_extension_and_a_contradiction_or_a_directory_is_one_line(tmp_path: Path, capsys) -> None:
    assert [out_format(f) for f in ("m.safetensors", "m.pt", "m.PTH", "pytorch_model.bin", "m.weights")] == \
        ["safetensors", "torch", "torch", "torch", "safetensors"]
    assert out_format("m.weights", "torch") == "torch" and out_format("m.pt", "torch") == "torch"
    for out, fmt in (("x.pt", "safetensors"), ("x.safetensors", "torch")):
        assert cli_main(["export", str(tmp_path), str(tmp_path / out), "--format", fmt]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"gearshift export: error: --format: {fmt} contradicts OUT {out}")
    assert not list(tmp_path.iterdir())  # refused before reading the run: nothing written
    (tmp_path / "dir").mkdir()
    assert cli_main(["export", str(tmp_path), str(tmp_path / "dir")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gearshift export: error: OUT: {tmp_path / 'dir'} is a directory; name the file to write (e.g. "
                   f"{tmp_path / 'dir' / 'model.safetensors'})"]
