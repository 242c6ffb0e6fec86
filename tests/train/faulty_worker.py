"""A training worker that raises at one step on one rank (FAULT=rank:step in argv[1]): what the launcher
tests use to see a crashed worker stop the whole job."""

import sys

from gearshift.train import __main__ as entry
from gearshift.train.data import ByteCorpus

rank, step = (int(v) for v in sys.argv.pop(1).split(":"))
batch = ByteCorpus.batch


def faulty_batch(self, s, *args, **kwargs):
    import torch.distributed as dist

    if s == step and dist.get_rank() == rank:
        raise RuntimeError(f"injected fault on rank {rank} at step {s}")
    return batch(self, s, *args, **kwargs)


ByteCorpus.batch = faulty_batch
sys.exit(entry.main())
