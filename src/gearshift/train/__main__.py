"""Worker entry point: `python -m gearshift.train [CONFIG] [--section.key=value ...] [--resume]`.

This is what `torchrun --nnodes ... -m gearshift.train CONFIG` runs on each process; the local
launcher runs it too, handing over the resolved config with `--from-json`."""

from __future__ import annotations

import json
import os
import sys

from gearshift.errors import UserError
from gearshift.train.config import config_from_dict, load_config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    resume = "--resume" in argv
    argv = [a for a in argv if a != "--resume"]
    try:
        if "--from-json" in argv:
            cfg = config_from_dict(json.loads(open(argv[argv.index("--from-json") + 1]).read()))
        else:
            path = argv[0] if argv and not argv[0].startswith("--") else None
            overrides = [a for a in argv if a.startswith("--")]
            if "WORLD_SIZE" in os.environ:  # under torchrun the job has as many workers as torchrun started
                overrides.append(f"--cluster.workers={os.environ['WORLD_SIZE']}")
            cfg = load_config(path, overrides)
    except UserError as e:
        print(f"gearshift.train: error: {e}", file=sys.stderr)
        return 2
    from gearshift.train.worker import run_worker

    run_worker(cfg, resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
