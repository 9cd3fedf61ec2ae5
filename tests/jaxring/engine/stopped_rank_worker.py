"""Run under mpirun by test_sync_mpi4jax.py: the toy run on mpi4jax's path, whose last process stops at step 5.

argv[1]: "sleep" (it hangs, as a stuck process does) or "exit" (it dies). The
others queue their steps and wait for them; the job must end all the same.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402

import jaxring  # noqa: E402
from toy_task import ToyTask, toy_config  # noqa: E402

from jaxring.engine.devices import replicate  # noqa: E402
from jaxring.engine.trainer import Trainer  # noqa: E402

STOP_AT = 5
world = jaxring.init()
train = {"batch_size": 4 * world.size * len(world.local_devices), "max_steps": 50, "across_processes": "mpi4jax"}
with tempfile.TemporaryDirectory() as workdir:
    trainer = Trainer(ToyTask(), toy_config(train=train), workdir, world)
state = replicate(trainer.init_state(), trainer.devices)
for step, batch in zip(range(50), trainer.batches):
    if step == STOP_AT and world.rank == world.size - 1:
        print(f"rank {world.rank} stops ({sys.argv[1]})", flush=True)
        if sys.argv[1] == "exit":
            os._exit(3)
        time.sleep(3600)
    state, _ = trainer.train_step(state, batch)
jax.block_until_ready(state)
print(f"rank {world.rank} finished 50 steps", flush=True)
