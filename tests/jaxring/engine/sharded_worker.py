"""Run under mpirun by test_sharded_step.py: the toy run of SHARDED_CONFIG in WORKDIR with train.shard_optimizer.

    mpirun -np P python -m mpi4py sharded_worker.py WORKDIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jaxring  # noqa: E402
from toy_task import SHARDED_CONFIG, ToyTask, toy_config  # noqa: E402

from jaxring.engine.trainer import Trainer  # noqa: E402

world = jaxring.init()
config = toy_config(**{**SHARDED_CONFIG, "train": {**SHARDED_CONFIG["train"], "shard_optimizer": True}})
Trainer(ToyTask(), config, Path(sys.argv[1]), world).fit()
