"""Run under mpirun by test_sync_mpi4jax.py: the Trainer's step with each train.across_processes, 50 steps queued.

Each process trains the toy task from the same state on its share of the same
global batches, once per label (PATH or PATH:ALLREDUCE_DTYPE), with nothing read
on the host between steps (a device-to-host transfer raises). After step 1 the
other processes go on only once process 0 has dispatched step 5: process 0's
loop must get there while its step 2 cannot finish. It checks that every process holds the same bits
and prints, per label, whether process 0 got ahead and the largest difference of
the final weights from jaxring's path's, relative to their largest magnitude.
The task also counts its steps and keeps its replica's index, int32 leaves that
neither path may average (jaxring/engine/model_state.py).
"""

import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jaxring  # noqa: E402
from test_step import DropoutTask  # noqa: E402
from toy_task import toy_config  # noqa: E402

from jaxring.engine.devices import replicate  # noqa: E402
from jaxring.engine.task import AXIS  # noqa: E402
from jaxring.engine.trainer import Trainer  # noqa: E402

STEPS = 50
AHEAD = 3  # process 0 dispatches steps 2 to 2 + AHEAD (counted from 1) before the others go on
world = jaxring.init()
replicas = world.size * len(world.local_devices)


class CountingDropoutTask(DropoutTask):
    """With WIDE more weights, decayed: XLA's CPU client runs a program of under 1000 flops in the thread
    that calls it when its inputs are ready, and the mean across processes of the toy task's few is one."""

    WIDE = 1024

    def init(self, rng):
        variables = super().init(rng)
        params = {**variables["params"], "wide": jax.random.normal(jax.random.fold_in(rng, 1), (self.WIDE,))}
        return {**variables, "params": params,
                "counts": {"steps": jnp.zeros((), jnp.int32), "replica": jnp.zeros((), jnp.int32)}}

    def loss(self, variables, batch, rng):
        loss, state = super().loss(variables, batch, rng)
        counts = {"steps": variables["counts"]["steps"] + 1, "replica": jax.lax.axis_index(AXIS)}
        return loss + 1e-2 * jnp.mean(variables["params"]["wide"] ** 2), {**state, "counts": counts}


def trained(label):
    across, _, wire = label.partition(":")
    train = {"batch_size": 3 * replicas, "max_steps": STEPS, "bucket_bytes": 64, "across_processes": across,
             "allreduce_dtype": wire or None}
    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(CountingDropoutTask(rows=96), toy_config(train=train), workdir, world)
    state = replicate(trainer.init_state(), trainer.devices)
    batches = [batch for _, batch in zip(range(STEPS), trainer.batches)]
    losses, ahead = [], None
    with jax.transfer_guard_device_to_host("disallow"):  # the steps queue: no value comes back between them
        for index, batch in enumerate(batches):
            if index == 1 and world.rank != 0:  # after step 0, which compiles the step on every process together
                wait_for_process_0()
            state, metrics = trainer.train_step(state, batch)
            losses.append(metrics["loss"])
            if world.rank == 0 and index == 1 + AHEAD:
                ahead = not losses[1].is_ready()  # step 1 waits for the others, which wait for this
                for rank in range(1, world.size):
                    MPI.COMM_WORLD.send(True, dest=rank)
    params = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state.params)]
    counts = jax.tree_util.tree_map(np.asarray, state.model_state["counts"])
    assert counts["steps"].dtype == np.int32 and counts["steps"].tolist() == [STEPS] * len(trainer.devices), label
    assert counts["replica"].tolist() == list(range(len(trainer.devices))), label  # each device's own
    assert all(np.array_equal(leaf[0], leaf[d]) for leaf in params for d in range(len(leaf))), label
    digest = hashlib.sha256(b"".join(leaf.tobytes() for leaf in params)).hexdigest()
    assert len(set(MPI.COMM_WORLD.allgather(digest))) == 1, f"{label}: the processes' weights differ"
    # the steps changed the weights (a 16-bit wire rounds the averaged loss: some repeat)
    assert len({float(np.asarray(loss)[0]) for loss in losses}) > STEPS // 2, label
    return ahead, [leaf[0].astype(np.float64) for leaf in params]


def wait_for_process_0(give_up_s=60):
    """Until process 0 says go; after give_up_s, a process 0 whose dispatch waits fails the check, not hangs."""
    deadline = time.monotonic() + give_up_s
    while not MPI.COMM_WORLD.Iprobe(source=0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if MPI.COMM_WORLD.Iprobe(source=0):
        MPI.COMM_WORLD.recv(source=0)


runs = {label: trained(label) for label in sys.argv[1:]}
for label, (ahead, params) in runs.items():
    reference = runs["jaxring"][1]  # float32 on the wire
    worst = max(np.abs(a - b).max() / np.abs(b).max() for a, b in zip(params, reference))
    print(f"rank {world.rank} {label} {worst:.3e}" + ("" if ahead is None else f" ahead {ahead}"), flush=True)
