"""Worker entry point: `python -m gearshift.train [CONFIG] [--section.key=value ...] [--resume[=PATH]]`.

This is what `torchrun --nproc-per-node N -m gearshift.train CONFIG` runs on each process: the job has
as many workers as torchrun started; `main` carries torch.distributed.elastic's `@record`, so a failure
leaves its traceback in the agent's error file. The local launcher (`gearshift train`) runs the same agent
(train.elastic) on this entry, handing over the resolved config with `--from-json` (and a test's or
benchmark's decisions with `--forcing`: train.forcing)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from gearshift.errors import UsageError, UserError
from gearshift.train.config import JobConfig, check_override_spelling, config_from_dict
from gearshift.train.env import load_job, reports_config_errors, under_torchrun


def _config(argv: list[str]) -> JobConfig:
    if "--from-json" in argv:  # a worker of the local launcher: the config it resolved and validated
        return config_from_dict(json.loads(Path(argv[argv.index("--from-json") + 1]).read_text()))
    check_override_spelling(argv)
    if not under_torchrun():
        raise UsageError("not started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR unset): run `gearshift train "
                         "CONFIG` for local workers, or `torchrun --nproc-per-node N -m gearshift.train CONFIG`")
    path = next((a for a in argv if not a.startswith("-")), None)
    overrides = list(argv)
    if path is not None:
        overrides.remove(path)
    return load_job(path, overrides)


QUIET_RANK_GRACE_S = 5.0  # how long a rank that does not report a config error waits before exiting


@record
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(f"{__doc__}\nThe config keys and their defaults: gearshift train --help")
        return 0
    resume: bool | str = False  # --resume: the newest good checkpoint; --resume=PATH: that one
    for a in [a for a in argv if a == "--resume" or a.startswith("--resume=")]:
        resume = a.split("=", 1)[1] if "=" in a else True
        argv.remove(a)
    forcing = None
    if "--forcing" in argv:  # the local launcher's, beside --from-json
        i = argv.index("--forcing")
        from gearshift.train.forcing import Forcing

        forcing = Forcing.load(argv[i + 1])
        del argv[i:i + 2]
    try:
        cfg = _config(argv)
    except UserError as e:  # every rank reads the same config: one line per machine, no traceback
        if reports_config_errors():
            print(f"gearshift.train: error: {e}", file=sys.stderr, flush=True)
        else:  # let the machine's reporter print first: torchrun stops the others once one process exits
            time.sleep(QUIET_RANK_GRACE_S)
        return 2
    from gearshift.train.run import run_worker

    run_worker(cfg, resume, forcing)
    return 0


if __name__ == "__main__":
    from gearshift.train.worker import exit_after

    exit_after(main)
