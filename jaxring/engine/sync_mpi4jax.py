"""Gradient sync with mpi4jax across processes (train.across_processes "mpi4jax"), as the design says.

The local devices average through jaxring's ring (or lax's: train.allreduce)
in the pmapped step, as on jaxring's path (jaxring/engine/sync.py); then
mpi4jax.allreduce averages that local mean over the processes, on one device
per process (one MPI call per process and bucket). So with one local device
the step is one pmapped program, mpi4jax inside it; with several it is three,
queued back to back with nothing read on the host: the pmapped gradients and
their local mean, a jit on the first local device that crosses processes, and
the pmapped update, to which pmap hands that mean on every local device.

The steps queue as on jaxring's path: mpi4jax's calls go through
mpi4jax_unordered.py, which keeps their order inside a program without JAX's
ordered effect (with it, JAX waits for each program before dispatching the
next). Across programs the data orders them: each step's mean is an input of
the next step's gradients.

train.allreduce_dtype: MPI has no 16-bit float sum (mpi4jax maps float32 and
wider), so a 16-bit wire is mpi4jax.allgather of each process' local mean
rounded to it, summed in float32 in rank order: each process' share rounded
once, and every process adds the same numbers in the same order. Its bytes
received are (processes - 1) x 2 per element, against 2 (processes - 1) /
processes x 4 for a float32 ring: fewer below 4 processes, more above.

mpi4jax's ops have no timeout: the step is watched (step_watchdog.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxring
from jaxring.collectives.fusion import fused
from jaxring.engine.model_state import averaged_part, with_averaged
from jaxring.engine.mpi4jax_unordered import unordered
from jaxring.engine.step_watchdog import StepWatchdog
from jaxring.engine.sync import Sync, make_sync
from jaxring.engine.task import AXIS

WHY_NO_TIMEOUT = "train.across_processes is mpi4jax, whose allreduce has no timeout"


class Mpi4jaxSync(Sync):
    """Mean over every device of every process: jaxring's ring locally, mpi4jax across processes."""

    across_processes = "mpi4jax"

    def __init__(self, world_size: int, method: str, bucket_bytes: int, wire_dtype: str | None = None):
        import mpi4jax  # noqa: F401  (imported here: the default path runs without it)
        from mpi4py import MPI

        super().__init__(world_size, method, bucket_bytes, wire_dtype)
        self.rank = MPI.COMM_WORLD.Get_rank()
        self.comm = MPI.COMM_WORLD.Clone()  # mpi4jax's messages apart from the job's others (collective)
        self._across_one = jax.jit(lambda tree: self.across(jax.tree_util.tree_map(lambda x: x[0], tree)))

    def local_mean(self, tree):
        """Mean of every leaf over this process' devices (AXIS), inside pmap."""
        local = "ring" if self.method == "ring" else "lax"
        return jaxring.tree_allreduce(tree, AXIS, "mean", bucket_bytes=self.bucket_bytes, local=local)

    def across(self, tree):
        """Mean of every leaf over the processes by mpi4jax, on one device: one call per fused bucket."""
        return unordered(lambda leaves: fused(self._bucket_mean, leaves, self.bucket_bytes))(tree)

    def _bucket_mean(self, flat):
        import mpi4jax
        from mpi4py import MPI

        floating = jnp.issubdtype(flat.dtype, jnp.floating)
        if floating and self.wire_dtype in ("bfloat16", "float16"):
            bits = jax.lax.bitcast_convert_type(flat.astype(self.wire_dtype), jnp.uint16)
            every = jax.lax.bitcast_convert_type(mpi4jax.allgather(bits, comm=self.comm), jnp.dtype(self.wire_dtype))
            total = every[0].astype(jnp.float32)
            for share in every[1:]:  # rank order, written out: the same additions on every process
                total = total + share.astype(jnp.float32)
        else:
            wire = flat.dtype if not floating or np.dtype(flat.dtype).itemsize >= 4 else jnp.float32
            total = mpi4jax.allreduce(flat.astype(wire), op=MPI.SUM, comm=self.comm)
        return (total / self.world_size).astype(flat.dtype)

    def mean(self, tree):
        """Mean over AXIS and every process, inside a pmap over one device (one MPI call per process)."""
        if jax.lax.axis_size(AXIS) != 1:
            raise ValueError(
                "train.across_processes mpi4jax: in a program over several devices each would call MPI on "
                "the same communicator; the step crosses processes between programs there, on one device "
                "(Mpi4jaxSync.train_step)")
        return self.across(self.local_mean(tree))

    def train_step(self, whole, parts, devices):
        """The step, watched: `whole` (make_train_step's program) on one local device, else split around mpi4jax."""
        n_devices = len(devices) if devices is not None else jax.local_device_count()
        program = whole if n_devices == 1 else self._split_step(parts, devices)
        watchdog = StepWatchdog(self.rank, WHY_NO_TIMEOUT)
        return lambda state, batch: watchdog.step(lambda: program(state, batch))

    def _split_step(self, parts, devices):
        def local_means(state, batch):  # model_state.py: the leaves not averaged stay each device's
            local = parts.local(state, batch)
            return self.local_mean(averaged_part(local)), local[1]

        def finish(state, averaged, model_state):
            return parts.finish(state, with_averaged(model_state, averaged))

        gradients = jax.pmap(local_means, axis_name=AXIS, devices=devices)
        update = jax.pmap(finish, axis_name=AXIS, in_axes=(0, None, 0), devices=devices, donate_argnums=0)

        def step(state, batch):
            averaged, model_state = gradients(state, batch)
            return update(state, self._across_first(averaged), model_state)
        return step

    def _mean_after(self, fn):  # time_mean's program: split as the step is
        if jax.local_device_count() == 1:
            return super()._mean_after(fn)
        local = jax.pmap(lambda tree: self.local_mean(fn(tree)), axis_name=AXIS)
        return lambda tree: self._across_first(local(tree))

    def _across_first(self, per_device):
        """across() of the first local device's copy of a pmapped tree (every local device holds the same)."""
        first = jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data, per_device)
        return self._across_one(first)  # a jit on the device that holds them


def sync_for(world_size: int, method: str, bucket_bytes: int, wire_dtype: str | None = None,
             across_processes: str = "jaxring") -> Sync:
    """The run's sync: train.across_processes' (`across_processes`); with one process nothing crosses
    processes, and the setting changes nothing. The other arguments as sync.make_sync's."""
    if across_processes == "mpi4jax" and world_size > 1:
        return Mpi4jaxSync(world_size, method, bucket_bytes, wire_dtype)
    return make_sync(world_size, method, bucket_bytes, wire_dtype)
