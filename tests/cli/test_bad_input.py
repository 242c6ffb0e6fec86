"""Bad input to any command is one line `gearshift VERB: error: ...` naming the field and what is allowed,
exit code 2, no traceback; and it is caught before any worker starts or any profiling runs."""

from __future__ import annotations

import json

import pytest
import torch

from gearshift.cli.main import main

CASES = [
    # config keys and overrides
    (["train", "--train.stepz=5"], "train.stepz: unknown key"),
    (["train", "--trian.steps=5"], "unknown section [trian]"),
    (["train", "--train.steps=many"], "train.steps: expected an integer"),
    (["train", "--train.steps=0"], "train.steps: must be >= 1"),
    (["train", "--train.lr=-1"], "train.lr: must be > 0"),
    (["train", "--parallel.schedule=zigzag"],
     "parallel.schedule: 'zigzag' (allowed: gpipe, 1f1b, kfkb, zb1p, interleaved, zbv, multidir, auto)"),
    (["train", "--cluster.memory_gb=[1, 2]"], "cluster.memory_gb: expected one value > 0 per rank (4 workers)"),
    (["train", "--cluster.memory_gb=-1"], "cluster.memory_gb: must be >= 0"),
    # what tests and benchmarks force is not a user's key (gearshift.train.forcing)
    (["train", "--adapt.force_schedule=[[10, 4, 1]]"], "adapt.force_schedule: unknown key (allowed in [adapt]: "
                                                       "every, alpha, profile, link_change"),
    (["train", "--adapt.force=[[4, [[0, 4], [4, 8]]]]"], "adapt.force: unknown key (allowed in [adapt]:"),
    (["train", "--moe.always_switch=true"], "moe.always_switch: unknown key (allowed in [moe]: every, window"),
    (["train", "--model.router_skew=2"], "model.router_skew: unknown key (allowed in [model]: name, layers"),
    (["train", "--adapt.link_change=-0.1"], "adapt.link_change: must be >= 0"),
    (["train", "--adapt.schedule_margin=1.5"], "adapt.schedule_margin: must be in [0, 1)"),
    (["train", '--cluster.traffic=["5:flows:1:2:4"]'], "cluster.traffic: needs cluster.testbed = true"),
    (["train", "--cluster.testbed=true", '--cluster.traffic=["5:flows:1:9:4"]', "--cluster.ranks_per_node=1"],
     "cluster.traffic[0].dst: expected an integer in 0..3, got 9"),
    (["train", "--cluster.testbed=true", '--cluster.traffic=["5:rate:1:fast"]', "--cluster.ranks_per_node=1"],
     "cluster.traffic[0].rate: expected a rate like 50mbit"),
    (["train", "--cluster.testbed=true", '--cluster.traffic=["5:flows:1:1:4"]', "--cluster.ranks_per_node=1"],
     "cluster.traffic[0]: src and dst must be different hosts"),
    (["train", "--cluster.testbed=true", '--cluster.traffic=["soon"]'], "cluster.traffic[0]: expected "
                                                                        "'STEP:flows:SRC:DST:N' or"),
    (["schedule", "--m", "2,3"], "--m: 3 does not divide the batch per replica (32); allowed: 1, 2, 4, 8, 16, 32"),
    (["schedule", "--bandwidth", "fast"], "--bandwidth: expected a rate like 100mbit"),
    (["schedule", "--latency", "soon"], "--latency: expected seconds or milliseconds"),
    (["train", "--parallel.schedule=multidir", "--parallel.directions=3"],
     "parallel.directions: must be in 2..2 (parallel.stages / 2) for multidir, got 3"),
    (["train", "--parallel.schedule=multidir", "--parallel.microbatches=2"],
     "parallel.microbatches: multidir needs at least parallel.stages (4) micro-batches per direction, got 2"),
    (["train", "--parallel.schedule=multidir", "--parallel.update=eventually"],
     "parallel.update: 'eventually' (allowed: flush, async)"),
    (["train", "--parallel.schedule=multidir", "--parallel.stages=2"],
     "parallel.stages: multidir runs every direction over all the workers, so stages must equal cluster.workers"),
    (["train", "--parallel.allreduce_transport=p2p", "--cluster.device=cuda"],
     "parallel.allreduce_transport: p2p carries CPU tensors over gloo only, got device 'cuda'"),
    (["train", "--parallel.schedule=multidir", "--parallel.partition=adaptive", "--parallel.update=async"],
     "parallel.partition: adaptive re-partitioning of multidir needs parallel.update = flush"),
    (["train", "--parallel.schedule=multidir", "--train.batch_size=24"],
     "train.batch_size: must split evenly over 2 direction(s) x parallel.microbatches (8), got 24"),
    (["train", "--parallel.stages=12", "--cluster.workers=12"], "parallel.stages: more stages (12) than layers (8"),
    (["train", "--parallel.stages=3"], "parallel.stages: must divide cluster.workers"),
    (["train", "--model.heads=3"], "model.width: must be divisible by model.heads"),
    (["train", "--parallel.partition=[[0,1],[1,2]]"], "parallel.partition: expected 4 ranges"),
    (["train", "--train.batch_size=30"], "train.batch_size: must split evenly"),
    (["train", "--cluster.spec=missing.toml"], "cluster.spec: file not found"),
    (["train", "--cluster.device=tpu"], "cluster.device: 'tpu' (allowed: auto, cpu, cuda)"),
    (["train", "--cluster.device=cpu", "--cluster.backend=nccl"],
     "cluster.backend: nccl carries CUDA tensors, but cluster.device is cpu (allowed with cpu: gloo or auto)"),
    (["profile", "--cluster.device=cuda", "--cluster.backend=gloo"], "cluster.backend: gloo carries CPU tensors"),
    (["train", "--train"], "expected --section.key=value"),
    (["train", "--train.steps", "5"], "--train.steps: expected --train.steps=VALUE (got a space: --train.steps 5)"),
    (["train", "--train.steps"], "--train.steps: expected --train.steps=VALUE"),
    (["profile", "--model.layers", "8"], "--model.layers: expected --model.layers=VALUE (got a space"),
    (["train", "job.toml", "extra.toml"], "unexpected argument 'extra.toml': one config file"),
    (["train", "--resume=yes"], "--resume=yes: no such checkpoint"),
    # the config file
    (["train", "no/such/config.toml"], "config: file not found: no/such/config.toml"),
    (["train", "adir"], "config: adir is a directory, not a file"),
    (["train", "bad.toml"], "config: bad.toml is not valid TOML"),
    (["train", "binary.toml"], "config: binary.toml is not UTF-8 text"),
    (["train", "unknown_section.toml"], "unknown_section.toml: unknown section [trainer] (allowed: model, data"),
    (["train", "top_level_key.toml"], "top_level_key.toml: steps = 5 is outside any section; it goes under [train]"),
    (["train", "--train=5"], "expected --section.key=value"),
    (["train", "spec.toml"], "spec.toml: this is a cluster spec ([types]), not a job; name it in a job as "
                             "cluster.spec"),
    (["train", "--cluster.spec=job.toml"], "cluster.spec: job.toml: unknown section 'train' (allowed: network, nodes, "
                                          "types); this is a job config, not a cluster spec"),
    (["train", "--cluster.spec=spec_no_memory.toml"], "cluster.spec: spec_no_memory.toml: types.A.memory_gb: missing"),
    # paths named by the config: checked before any worker starts
    (["train", "--output.dir=afile"], "output.dir: afile is a file, not a directory"),
    (["train", "--output.dir=afile/run"], "output.dir: afile/run is under afile, which is a file"),
    (["train", "--data.path=no/such/corpus"], "data.path: no such file or directory: no/such/corpus"),
    (["train", "--data.path=adir"], "data.path: directory adir holds no files"),
    (["train", "--data.path=afile"], "data.path: file afile is empty"),
    (["train", "--adapt.profile=notjson.txt"], "adapt.profile: notjson.txt is not valid JSON"),
    (["train", "--adapt.profile=profile4.json"], "adapt.profile: profile4.json profiles 4 layers, the job's model "
                                                 "has 8"),
    # profile / simulate / plan
    (["simulate", "--profile", "missing.json"], "--profile: file not found: missing.json"),
    (["simulate", "--profile", "notjson.txt"], "--profile: notjson.txt is not valid JSON"),
    (["simulate", "--profile", "nolayers.json"], "--profile: nolayers.json is not a ModelProfile written by "
                                                 "`gearshift profile` (missing 'layers')"),
    (["simulate", "--profile", "badlayer.json"], "--profile: badlayer.json is not a ModelProfile"),
    (["simulate", "--profile", "profile4.json"], "--profile: profile4.json profiles 4 layers, the job's model has 8"),
    (["simulate", "--trace", "afile/trace.json"], "--trace: afile/trace.json is under afile, which is a file"),
    (["simulate", "--trace", "adir"], "--trace: adir is a directory, not a file"),
    (["profile", "--out", "afile/profile.json"], "--out: afile/profile.json is under afile, which is a file"),
    (["profile", "--output.dir=afile"], "output.dir: afile is a file, not a directory"),
    (["profile", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["profile", "--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
    (["plan", "--stages", "0"], "argument --stages: must be >= 1, got 0"),
    (["plan", "--stages", "-2"], "argument --stages: must be >= 1, got -2"),
    (["plan", "--microbatches", "0"], "argument --microbatches: must be >= 1, got 0"),
    (["plan", "--stages", "two"], "argument --stages: expected an integer >= 1, got 'two'"),
    (["plan", "--profile", "nolayers.json"], "--profile: nolayers.json is not a ModelProfile"),
    (["trian"], "argument COMMAND: invalid choice: 'trian'"),
]
if not torch.cuda.is_available():  # a device this machine cannot give: caught before workers start or profiling
    CASES += [(["train", "--cluster.device=cuda"], "cluster.device: cuda, but torch finds no CUDA device on this "
                                                   "machine"),
              (["train", "--cluster.backend=nccl"], "cluster.backend: nccl, but torch finds no CUDA device"),
              (["profile", "--cluster.device=cuda"], "cluster.device: cuda, but torch finds no CUDA device")]


def _profile(layers: int) -> dict:
    row = dict(forward_s=1e-3, backward_s=2e-3, flops=1e6, param_bytes=1000, activation_bytes=100,
               peak_activation_bytes=1000)
    return {"layers": [dict(row, name=f"{i}:Layer") for i in range(layers)], "microbatch_size": 2, "seq_len": 16}


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A working directory holding the bad inputs the cases name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    (tmp_path / "job.toml").write_text("[train]\nsteps = 3\n")
    (tmp_path / "bad.toml").write_text("[train\nsteps = 3")
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe\x00\x01")
    (tmp_path / "unknown_section.toml").write_text("[trainer]\nsteps = 3\n")
    (tmp_path / "top_level_key.toml").write_text("steps = 5\n")
    (tmp_path / "spec.toml").write_text('[types.A]\nspeed = 1.0\nmemory_gb = 8\n[[nodes]]\ndevices = ["A"]\n')
    (tmp_path / "spec_no_memory.toml").write_text("[types.A]\nspeed = 1.0\n")
    (tmp_path / "notjson.txt").write_text("not json")
    (tmp_path / "nolayers.json").write_text("{}")
    (tmp_path / "badlayer.json").write_text(json.dumps({"layers": [{"name": "x"}], "microbatch_size": 2,
                                                        "seq_len": 16}))
    (tmp_path / "profile4.json").write_text(json.dumps(_profile(4)))
    return tmp_path


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_exit_2(files, capsys, args, message):
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    verb = args[0] if args[0] != "trian" else ""
    assert lines[0].startswith(f"gearshift {verb}".rstrip() + ": error: "), lines[0]
    assert message in lines[0]
    assert not out  # nothing ran

