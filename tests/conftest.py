"""The repository root on the path, so that tests (and the workers they spawn) import examples/ by name; fixtures
that tests in several packages share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def one_rank():
    """A gloo process group of one rank in this process (collectives of a single-rank job)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _starts_processes(item) -> bool:
    return bool(item.get_closest_marker("multiprocess") or item.get_closest_marker("subprocess"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Order for `make test`'s worksteal, which hands each of N workers one contiguous share of the items and lets an
    idle worker steal the end of another's: each share begins with its part of the tests that start processes (the
    long ones; whole modules, so that a module's fixture runs once) and ends with short ones, so that the end of the
    run is short tests on every worker, not one long test running alone. Without xdist: those tests first."""
    n = int(getattr(config, "workerinput", {}).get("workercount", 1))
    modules: dict[str, list] = {}
    for item in items:
        if _starts_processes(item):
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    shares: list[list] = [[] for _ in range(n)]
    for group in modules.values():  # in collection order, each to the share with fewest so far
        min(shares, key=len).extend(group)
    light = [item for item in items if not _starts_processes(item)]
    size = -(-len(items) // n)
    for share in shares:
        take = max(size - len(share), 0)
        share.extend(light[:take])
        del light[:take]
    shares[-1].extend(light)
    items[:] = [item for share in shares for item in share]
