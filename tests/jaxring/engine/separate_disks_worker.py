"""Run under mpirun by test_trainer.py: every process resumes the toy run from a working directory of its own.

Only process 0's directory holds the checkpoints, as when each node has its own disk.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jaxring  # noqa: E402
from toy_task import SEPARATE_DISKS_CONFIG, ToyTask, toy_config  # noqa: E402

from jaxring.engine.trainer import Trainer  # noqa: E402

world = jaxring.init()
workdir = Path(sys.argv[1]) / f"rank{world.rank}"
summary = Trainer(ToyTask(), toy_config(**SEPARATE_DISKS_CONFIG), workdir, world).fit(resume=True)
print(f"rank {world.rank} resumed_at_step {summary.get('resumed_at_step')} steps {summary['steps']} "
      f"test_step {summary['test_step']}", flush=True)
