"""A worker process's way out: its exit code and its error's lines, without the interpreter's teardown (where
gloo's leftover work objects can abort the process under load: SIGABRT and a C++ trace under the error)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    import torch.distributed as dist
    from gearshift.errors import DataError
    from gearshift.train.worker import run_as_worker

    atexit.register(lambda: print("interpreter teardown ran", file=sys.stderr, flush=True))
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    print("step 0 written", flush=True)  # buffered output before the error still reaches the launcher

    def body():
        raise DataError("output.dir: cannot write the checkpoint x: No space left on device")

    run_as_worker(body)
""")


@pytest.mark.subprocess
def test_a_worker_stopped_by_bad_input_exits_2_with_one_line_and_skips_the_teardown(tmp_path):
    env = {"RANK": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "step 0 written\n"
    assert r.stderr == ("gearshift train: error: output.dir: cannot write the checkpoint x: No space left on "
                        "device\n")


EXIT_AFTER = textwrap.dedent("""
    import atexit, sys
    from gearshift.train.worker import exit_after

    atexit.register(lambda: print("interpreter teardown ran", file=sys.stderr, flush=True))

    def main():
        print("worked", flush=True)
        if sys.argv[1] == "fail":
            raise ValueError("a bug in a forward")
        if sys.argv[1] == "bad-input":
            raise SystemExit(2)
        return 0

    exit_after(main)
""")


@pytest.mark.subprocess
@pytest.mark.parametrize("how, code", [("ok", 0), ("bad-input", 2), ("fail", 1)])
def test_a_worker_main_exits_with_its_code_and_error_and_skips_the_teardown(how, code):
    r = subprocess.run([sys.executable, "-c", EXIT_AFTER, how], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}, timeout=120)
    assert (r.returncode, r.stdout) == (code, "worked\n")
    assert "interpreter teardown ran" not in r.stderr
    assert r.stderr.strip().splitlines()[-1:] == (["ValueError: a bug in a forward"] if how == "fail" else [])
