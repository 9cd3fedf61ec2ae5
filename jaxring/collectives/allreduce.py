"""jaxring.allreduce: lax.psum, pmean, pmax and pmin over the ring, and over MPI processes with processes=.

Leaf by leaf: a value no trace computed, an empty array and a ring of one device are lax's
(arguments.py, ring_primitive.ring_of_one); types narrower than the handlers take cross in a
wider one (arguments.wider_type); groups of different sizes go as rows (index_groups.py);
processes= adds the MPI leg (across_processes.py); everything else is one bind of ring_p.
"""

import functools
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.collectives import (_ffi, _jax_compat, accumulation, across_processes, index_groups, mpi_ops,
                                 ring_primitive)
from jaxring.collectives.arguments import (LAX_OPS, OPS, as_supported_array, checked_axes, checked_wire_dtype,
                                           device_names, not_numbers, timeout_ms as checked_timeout_ms,
                                           unreduced_as_varying, wider_type)
from jaxring.collectives.kinds import ALLREDUCE


def allreduce(x, axis_name, op="sum", *, axis_index_groups=None, processes=False, timeout=None, wire_dtype=None):
    """Sum (op="sum", as jax.lax.psum), mean (as jax.lax.pmean), max (as jax.lax.pmax) or min
    (as jax.lax.pmin) of every leaf of `x` over `axis_name`.

    Every device gets a bitwise identical result: each chunk is reduced once,
    by one rank, in one order. bfloat16 and float16 are accumulated in float32,
    integers wrap, complex numbers add component by component; the mean of an
    integer is a float, as lax.pmean's; bools are summed as int32. Max and min
    are lax's on CPU: NaNs are skipped (all NaN gives -inf / +inf) and of -0.0
    and +0.0 the lowest device's wins (csrc/core/reduction.h; the ring path,
    which the CPU engine takes only when forced or for rings of more than 16
    devices, may give the other zero); they have no derivative, as lax's.
    `timeout` (seconds, inf for none) bounds the wait for the other devices;
    see jaxring/collectives/timeout.py.
    `axis_name` may name vmap axes too, alone or with device axes (reduced inside the program);
    `axis_index_groups` splits the axis into groups, as lax's: groups of one size each run their
    own ring; groups of different sizes run one ring over the whole axis on a row per group
    (len(groups) times the bytes), each device adding into its own group's row.

    processes=True also reduces over every process of the MPI job (mpirun or
    srun, each process mapping `axis_name` over its own devices): the sum (or
    max, min) of the leaf over all devices of all processes, the mean dividing
    by their count, inside the same compiled program (jaxring/collectives/mpi.py).
    processes=comm, an mpi4py intracommunicator of the job
    (MPI.COMM_WORLD.Split(...)), reduces over the processes of `comm` only:
    the mean divides by the local devices x comm.Get_size(). Every process of
    the communicator must run the same program; the others do not call it (a
    process holding MPI.COMM_NULL is refused). With one process it is
    processes=False. With `axis_index_groups`, each group of this process' devices reduces
    with the same group of every process. Naming no device axis (axis_name=(), or vmap
    axes only) it reduces over the processes alone, as mpi4jax.allreduce: in jit on one
    device, outside jit, or under pmap/shard_map per device (each meeting the same device of
    every process).
    wire_dtype="bfloat16" or "float16" (with processes= only) sends a float leaf's chunks
    between processes in 16 bits, half float32's bytes: each hop of the MPI leg adds in
    float32 and rounds the partial result to 16 bits as it crosses; the local rings stay in
    the leaf's precision. None (the default): chunks cross in the accumulation type,
    rounded once.
    """
    _ffi.register()  # every op, a ring of one too: the settings' errors come at once
    if op not in OPS:
        raise ValueError(_refused_op(op))
    names, ranks, groups = checked_axes(axis_name, ALLREDUCE, axis_index_groups)
    timeout_ms = checked_timeout_ms(timeout)
    communicator = across_processes.communicator(processes)
    _check_allreduce_axes(names, groups, communicator)
    if not names and communicator is None:
        _warn_if_in_an_mpi_job(processes)
    wire_dtype = checked_wire_dtype(wire_dtype, processes)

    lax_reduce = LAX_OPS[op]
    reduction = "sum" if op == "mean" else op

    def reduce_leaf(leaf):
        if not_numbers(leaf):
            return lax_reduce(leaf, names, axis_index_groups=groups)
        x = jnp.asarray(leaf)
        if x.dtype == jnp.bool_ and reduction == "sum":  # as lax.psum: booleans are summed as int32 (counted)
            x = x.astype(jnp.int32)
        if (wide := wider_type(x.dtype)) is not None:
            # As lax's: the reduction lands in the narrow type (an integer sum wrapped in it), and a
            # mean divides that, in that type.
            total = allreduce(x.astype(wide), names, reduction, axis_index_groups=groups, processes=processes,
                              timeout=timeout, wire_dtype=wire_dtype).astype(x.dtype)
            return total / _devices_in_mean(names, ranks, groups, communicator) if op == "mean" else total
        x = as_supported_array(x, "allreduce")
        if reduction != "sum" and jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise TypeError(f"jaxring.allreduce(op={op!r}) of {x.dtype}: complex numbers have no order, and "
                            f"lax.p{op} refuses them too (XLA has no such reduction); reduce their real and "
                            "imaginary parts, or their absolute values, instead")
        if reduction == "sum":
            x = unreduced_as_varying(x, names, "allreduce", groups)
        if communicator is not None:
            devices = device_names(names)
            vmapped = tuple(name for name in names if name not in devices)
            partial = x
            # The vmap axes' part first, inside the program (ring_primitive.py), in the accumulation type: rounded once.
            if vmapped:
                partial = allreduce(x.astype(accumulation.accumulation_dtype(x.dtype)), vmapped, reduction,
                                    timeout=timeout)
            total = across_processes.allreduce_over_processes(partial, devices, op, groups, communicator, timeout_ms,
                                                              wire_dtype, ring_primitive.bind).astype(x.dtype)
            if op == "mean":
                return accumulation.mean(total, _devices_in_mean(names, ranks, groups, communicator))
            return total
        if not isinstance(leaf, jax.core.Tracer):
            # A value no trace computed (a Python or numpy scalar, a constant) is the same on
            # every device: lax sums it when tracing, with no collective, so jaxring does too,
            # to lax's type (a Python scalar stays one).
            return lax_reduce(leaf, names, axis_index_groups=groups)
        lax_op = functools.partial(lax_reduce, x, names, axis_index_groups=groups)
        sizes_differ = index_groups.sizes_differ(groups)  # then `ranks` is the first group's size only
        if ranks == 1 and not sizes_differ:
            return ring_primitive.ring_of_one(lax_op, lambda: accumulation.mean(x, 1) if op == "mean" else x)
        if x.size == 0:
            return lax_op()
        if sizes_differ:
            return _within_groups_of_different_sizes(x, names, groups, op, timeout_ms)
        total = ring_primitive.bind(x.reshape(-1), kind=ALLREDUCE, names=names, timeout_ms=timeout_ms,
                                    reduction=reduction, groups=groups).reshape(x.shape)
        return accumulation.mean(total, ranks) if op == "mean" else total

    return jax.tree_util.tree_map(reduce_leaf, x)


def _within_groups_of_different_sizes(x, names, groups, op, timeout_ms):
    """allreduce of `x` within each of `groups` where they differ in size (index_groups.in_rows_by_group),
    over this process' devices."""
    reduction = "sum" if op == "mean" else op
    own = index_groups.in_rows_by_group(x, names, groups, reduction, functools.partial(
        ring_primitive.bind, kind=ALLREDUCE, names=names, timeout_ms=timeout_ms, reduction=reduction))
    return accumulation.mean(own, _devices_in_mean(names, None, groups, None)) if op == "mean" else own


def _devices_in_mean(names, ranks, groups, communicator):
    """What allreduce(op="mean") divides by: the devices of the ring (a group's, traced where the
    groups differ in size) times the processes of `communicator` (None: this one)."""
    processes = 1 if communicator is None else communicator.size
    if index_groups.sizes_differ(groups):
        counts = jnp.asarray([len(group) * processes for group in groups], np.int32)
        return counts[index_groups.own_group(names, groups)]
    return ranks * processes


def _refused_op(op) -> str:
    """What allreduce says of an `op` it does not take: an mpi4py MPI.Op (mpi4jax's spelling) named, with its call."""
    if not mpi_ops.is_op(op):
        return f"op must be one of {OPS}, got {op!r}"
    name, ring = mpi_ops.name(op), mpi_ops.ring_name(op)
    if ring is None:
        return (f"jaxring.allreduce(op={name}): jaxring's ring does op={OPS} only; call mpi4jax.allreduce itself "
                f"for {name} (the two mix in one program)")
    return (f"jaxring.allreduce(op={name}): jaxring names its ops as lax does, op={ring!r}; or "
            f"`import jaxring.mpi4jax as mpi4jax` for mpi4jax's allreduce(x, {name}, comm=...) over jaxring's leg")


def _warn_if_in_an_mpi_job(processes):
    """allreduce(x, ()) reduces over nothing and returns x, as lax.psum(x, ()): mpi4jax's users, whose comm
    defaults to COMM_WORLD, met that as a silent wrong answer. Where MPI is running (mpi4py imported: never
    started here) with several processes and processes= was left out, say so."""
    mpi4py = sys.modules.get("mpi4py.MPI")
    if processes is False and mpi4py is not None and mpi4py.Is_initialized() and mpi4py.COMM_WORLD.Get_size() > 1:
        warnings.warn(
            f"jaxring.allreduce(x, ()) names no axis and no processes, so it returns x (as lax.psum(x, ()) does), "
            f"though this is one of {mpi4py.COMM_WORLD.Get_size()} MPI processes: pass processes=True (or "
            "processes=comm) to reduce over them, or call jaxring.mpi4jax.allreduce(x, MPI.SUM), whose comm "
            "defaults to MPI.COMM_WORLD", stacklevel=3)


def _check_allreduce_axes(names, groups, communicator):
    """What allreduce refuses besides lax's refusals (arguments.checked_axes): groups where lax.psum refuses
    them (typed), and processes= outside pmap and shard_map under jax.distributed."""
    if groups is not None and _jax_compat.checking_varying_axes():
        raise NotImplementedError(
            "jaxring.allreduce with axis_index_groups under jax.shard_map(check_vma=True): lax.psum refuses it "
            "there too; pass check_vma=False to jax.shard_map, or drop axis_index_groups"
        )
    if communicator is not None and not _jax_compat.device_axes() and jax.process_count() > 1:
        raise ValueError(
            f"jaxring.allreduce(..., processes=...) over {names} outside jax.pmap and jax.shard_map under "
            f"jax.distributed ({jax.process_count()} processes): there a jit program's arrays span the processes, "
            "so no value is one process' own to reduce across them. Call it under jax.shard_map over jax.devices() "
            "and name the mesh axis (that reduces over the processes, without processes=), or leave jax.distributed "
            "uninitialised to reduce each process' own values."
        )


