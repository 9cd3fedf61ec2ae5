"""Run under mpirun by test_data_check.py: the start-up data check where rank 1's data is missing, then differs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jaxring  # noqa: E402
from toy_task import ToyTask, toy_config  # noqa: E402

from jaxring.engine.host_exchange import HostExchange  # noqa: E402
from jaxring.engine.task import DataError  # noqa: E402

world = jaxring.init()
for case in ("same", "missing", "differs"):
    class Task(ToyTask):
        def check_data(self):
            if case == "missing" and world.rank == 1:
                raise DataError("data.manifest_dir /data/mine has no train.jsonl")
            return {"train": {"usable": 96 - (world.rank if case == "differs" else 0)}}

    try:
        report = HostExchange(world.comm, world.rank).check_before_training(toy_config(), Task())
        print(f"rank {world.rank} {case}: {report}", flush=True)
    except DataError as e:
        print(f"rank {world.rank} {case}: DataError: {e}", flush=True)
