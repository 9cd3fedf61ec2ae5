"""All-reduce over every device of every process: local ring, a ring of processes, local ring.

With L local devices and P processes, `global_allreduce` runs

1. a pmap over the local devices: ring reduce-scatter, so local device i holds
   chunk i (1/L of the buffer) of this node's sum;
2. for each local device i, in its own thread, a single-device jit that
   all-reduces chunk i across the P processes over `world.device_comms[i]`
   (mpi4jax sendrecv in a ring, the adds done on the device, or
   MPI_Allreduce through mpi4jax.allreduce);
3. a pmap over the local devices: ring all-gather of the reduced chunks.

mpi4jax ops carry an ordered effect, which JAX refuses in a computation over
more than one device, hence step 2 is one jit per device rather than part of
the pmap. Each device has its own communicator, so the L exchanges proceed at
the same time and never take each other's messages.

GPU arrays: by default mpi4jax copies each chunk to host memory and back
around the MPI call, which works with any MPI (MPI4JAX_USE_CUDA_MPI=0 says so
and silences mpi4jax's warning). With a CUDA-aware MPI, set
MPI4JAX_USE_CUDA_MPI=1 in every process's environment (mpi4jax reads it at
its first GPU call) and MPI reads and writes device memory directly.
"""

import functools
import json
import math
import os
import pathlib
import threading
import time

import jax
import jax.numpy as jnp
import mpi4jax
from mpi4py import MPI

from jaxring.collectives import accumulation, agreement, ring, topology
from jaxring.collectives import timeout as timeout_lib

ALGORITHMS = ("ring", "mpi", "auto")
# Which cross-process algorithm was faster, by process count and bytes per
# device: the table at $JAXRING_ALLREDUCE_TABLE (scripts/bench_allreduce_mpi.py
# --write-table PATH measures one), else the one shipped with the package,
# measured on the machine and date written inside it. jaxring never writes it.
TABLE_PATH = pathlib.Path(
    os.environ.get("JAXRING_ALLREDUCE_TABLE") or pathlib.Path(__file__).with_name("global_allreduce_table.json")
)
# "auto" without a table: MPI_Allreduce below this many bytes per device, ring above.
DEFAULT_RING_MIN_BYTES = 1 << 20
_AXIS = "jaxring_local"
# MPI has no 16-bit float types; such chunks travel as their bits.
_WIRE_DTYPES = {jnp.dtype(jnp.bfloat16): jnp.uint16, jnp.dtype(jnp.float16): jnp.uint16}


def global_allreduce(x, op: str = "sum", algorithm: str = "ring", *, timeout: float | None = None):
    """Sum (or mean) of every leaf of `x` over all local devices of all processes.

    Args:
      x: a pytree of arrays whose leading axis is the number of local devices
        (as ``pmap`` returns them), of float32, bfloat16, float16 or int32.
        Every process must call with the same structure, shapes, dtypes, op
        and algorithm.
      op: "sum" or "mean" (the sum divided by the number of devices of all
        processes; of int32, a float32, as lax.pmean's).
      algorithm: "ring" (ring of processes over mpi4jax sendrecv), "mpi"
        (MPI_Allreduce through mpi4jax.allreduce), or "auto" (whichever the
        table measured by scripts/bench_allreduce_mpi.py says is faster for
        this size). Only the cross-process step differs; with one process all
        three are the local ring all-reduce.
      timeout: seconds (inf: no limit) that every process waits for the
        others, at the agreement before the exchange, in the exchange itself
        and in the local rings, before raising TimeoutError naming the
        processes that did not answer; default jaxring.default_timeout().

    Returns:
      `x`'s structure of arrays of its leaves' shapes, sharded over the local
      devices like pmap outputs, every row holding the same result, bitwise
      equal on every device of every process for "ring". 16-bit floats are
      accumulated in float32, int32 exactly in int32. Each leaf is its own
      collective: fuse small leaves first (jaxring.collectives.fusion) where that matters.

    Call it outside jit, between pmapped steps; it returns once the
    cross-process exchange is done. GPU arrays go through host
    memory around each MPI call unless MPI4JAX_USE_CUDA_MPI=1 is set with a
    CUDA-aware MPI (see the module docstring).
    """
    world = topology.init()
    if op not in ring.OPS:  # the in-jit ops own the list
        raise ValueError(f"op must be one of {ring.OPS}, got {op!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    timeout_lib.resolve(timeout)  # a bad timeout fails here, before any process waits
    return jax.tree_util.tree_map(lambda leaf: _global_allreduce_leaf(leaf, op, algorithm, timeout, world), x)


def _global_allreduce_leaf(x, op, algorithm, timeout, world):
    _check_leaf(x, world)
    if algorithm == "auto":
        algorithm = choose_algorithm(math.prod(x.shape[1:]) * x.dtype.itemsize, world.size)
    agreement.agree(
        world.comm,
        "global_allreduce",
        f"{jnp.dtype(x.dtype).name}{list(x.shape)} op={op} algorithm={algorithm}",
        timeout,
    )
    if world.size == 1 or x.size == 0:  # nothing crosses processes
        return _local_allreduce(world.local_devices, op, timeout)(x)
    divisor = world.n_devices if op == "mean" else 1
    what = f"global_allreduce of {jnp.dtype(x.dtype).name}{list(x.shape)}"
    if len(world.local_devices) == 1:  # the local ring would only copy
        shard = jax.device_put(x, world.local_devices[0])
        return _exchange(world, [lambda: _across_processes(world, 0, algorithm, divisor)(shard)], what, timeout)[0]
    shards = _local_reduce_scatter(world.local_devices, timeout)(x)
    exchanges = [
        functools.partial(_across_processes(world, i, algorithm, divisor), s.data)
        for i, s in enumerate(shards.addressable_shards)
    ]
    reduced = _exchange(world, exchanges, what, timeout)
    reduced = jax.make_array_from_single_device_arrays(shards.shape, shards.sharding, reduced)
    return _local_all_gather(world.local_devices, x.shape[1:], timeout)(reduced)


def choose_algorithm(nbytes: int, n_procs: int) -> str:
    """The cross-process algorithm "auto" picks for `nbytes` per device among `n_procs` processes.

    From the measurement nearest in process count, then in log size; without
    a table, "mpi" below DEFAULT_RING_MIN_BYTES and "ring" from there on.
    """
    rows = _table()
    if not rows:
        return "ring" if nbytes >= DEFAULT_RING_MIN_BYTES else "mpi"
    nearest = min(
        rows,
        key=lambda row: (
            abs(row["n_procs"] - n_procs),
            abs(math.log2(max(row["bytes"], 1)) - math.log2(max(nbytes, 1))),
        ),
    )
    return nearest["fastest"]


@functools.cache
def _table() -> tuple:
    if not TABLE_PATH.exists():
        return ()
    return tuple(json.loads(TABLE_PATH.read_text())["measured"])


def _check_leaf(x, world):
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            "global_allreduce talks to MPI from the host, so it runs outside jit: end the "
            "pmapped step before it and start the next one after (inside pmap, "
            "jaxring.allreduce reduces over the local devices)"
        )
    n_local = len(world.local_devices)
    if not hasattr(x, "shape") or x.ndim < 1 or x.shape[0] != n_local:
        raise ValueError(
            f"every leaf of x must have a leading axis of {n_local} (one row per local device, as "
            f"pmap returns it), got shape {getattr(x, 'shape', type(x).__name__)}"
        )
    if not any(x.dtype == d for d in ring.SUPPORTED_DTYPES):
        raise TypeError(
            f"global_allreduce reduces arrays of {ring.SUPPORTED_DTYPE_NAMES}, got dtype {x.dtype}"
        )


def _exchange(world, exchanges, what: str, timeout: float | None) -> list:
    """[exchange() done] for each local device's exchange, all at once, within the timeout.

    Each runs in a daemon thread of its own, as each blocks in MPI until the
    other processes take part; a process that never does leaves the threads
    blocked, and the TimeoutError (after a roll call naming it) says to end the job.
    """
    seconds = timeout_lib.resolve(timeout)
    results = [None] * len(exchanges)
    errors = []

    def run(i):
        try:
            results[i] = jax.block_until_ready(exchanges[i]())
        except BaseException as e:  # handed to the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), name=f"jaxring-mpi-{i}", daemon=True) for i in range(len(exchanges))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(None if math.isinf(seconds) else max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise agreement.timeout_error(world.comm, f"{what}, in the exchange across processes", seconds)
    if errors:
        raise errors[0]
    return results


@functools.cache
def _local_allreduce(devices, op, timeout):
    return jax.pmap(lambda x: ring.allreduce(x, _AXIS, op, timeout=timeout), _AXIS, devices=devices)


@functools.cache
def _local_reduce_scatter(devices, timeout):
    """Local device i gets chunk i of the flattened local sum, zero-padded to equal chunks."""
    n = len(devices)

    def reduce_scatter(x):
        flat = x.reshape(-1)
        chunk = -(-flat.size // n)
        padded = jnp.pad(flat, (0, n * chunk - flat.size)).reshape(n, chunk)
        return ring.reduce_scatter(padded, _AXIS, timeout=timeout)

    return jax.pmap(reduce_scatter, _AXIS, devices=devices)


@functools.cache
def _local_all_gather(devices, shape, timeout):
    """The inverse of _local_reduce_scatter: the chunks joined, unpadded, in `shape`."""

    def all_gather(chunk):
        return ring.all_gather(chunk, _AXIS, timeout=timeout).reshape(-1)[: math.prod(shape)].reshape(shape)

    return jax.pmap(all_gather, _AXIS, devices=devices)


@functools.cache
def _across_processes(world, index, algorithm, divisor):
    """Single-device jit: all-reduce over the processes of an array on local device `index`."""
    comm = world.device_comms[index]

    def across(x):
        flat = x.reshape(-1)
        if algorithm == "ring":
            total = _ring_allreduce(flat, comm, world.rank, world.size)
        else:
            total = mpi4jax.allreduce(
                flat.astype(accumulation.accumulation_dtype(flat.dtype)), op=MPI.SUM, comm=comm
            ).astype(flat.dtype)
        if divisor != 1:
            total = accumulation.mean(total, divisor)
        return total.reshape(x.shape)

    return jax.jit(across)


def _ring_allreduce(flat, comm, rank, size):
    """Ring all-reduce of a 1-D array over the processes of `comm` (docs/ARCHITECTURE.md, "The ring").

    Each chunk is summed once, by one process, in one order, then copied to the
    others: every process ends with the same bits.
    """
    dtype = flat.dtype
    chunk = -(-flat.size // size)
    padded = jnp.pad(flat.astype(accumulation.accumulation_dtype(dtype)), (0, size * chunk - flat.size))
    chunks = list(padded.reshape(size, chunk))
    left, right = (rank - 1) % size, (rank + 1) % size
    for step in range(size - 1):  # reduce-scatter: afterwards this rank owns chunk rank + 1
        send, receive = (rank - step) % size, (rank - step - 1) % size
        chunks[receive] = chunks[receive] + _sendrecv(chunks[send], comm, left, right)
    chunks = [c.astype(dtype) for c in chunks]
    for step in range(size - 1):  # all-gather
        send, receive = (rank + 1 - step) % size, (rank - step) % size
        chunks[receive] = _sendrecv(chunks[send], comm, left, right)
    return jnp.concatenate(chunks)[: flat.size]


def _sendrecv(x, comm, source, dest):
    """Sends x to `dest` and returns the array of x's shape and dtype received from `source`."""
    wire = _WIRE_DTYPES.get(x.dtype)
    if wire is not None:
        return jax.lax.bitcast_convert_type(
            _sendrecv(jax.lax.bitcast_convert_type(x, wire), comm, source, dest), x.dtype
        )
    return mpi4jax.sendrecv(x, x, source=source, dest=dest, comm=comm)

