"""The ring collectives as JAX ops, usable inside jit under pmap or shard_map.

Each op is one XLA custom call (_ring_call.py): the handlers of the devices
along the mapped axis wait for each other's progress (on CPU the engine of
csrc/cpu/cpu_engine.h, which runs csrc/core/ring_protocol.h; on CUDA the engines of
docs/CUDA_RING.md) and run one of the paths of docs/ARCHITECTURE.md. The devices of
each ring, in axis order, are read from the mesh when the op is lowered. What differs
between the three ops is one row each of kinds.py.

The public ops take lax's arguments and return lax's shapes and types:
`allreduce` is lax.psum / pmean / pmax / pmin, `reduce_scatter` lax.psum_scatter,
`all_gather` lax.all_gather. Under shard_map(check_vma=True) their outputs
carry lax's varying axes, so shard_map accepts and refuses what it does with
lax. A ring of one device has nothing to move: no custom call, no
collective at all, except under check_vma=True, where lax's op types the
result (see _ring_of_one). An empty array is lax's op. An axis name may be a
vmap axis, as lax's: vmap's part is computed over the batch dimension inside
the program, the devices' part by the ring (_batch_over_the_vmap_axis).
axis_index_groups split each ring into one ring per group (_rings).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from jaxring.collectives import _ffi, _jax_compat, _ring_call, accumulation, jax_tools, kinds, timeout as timeout_lib
from jaxring.collectives.kinds import ALL_GATHER, ALLREDUCE, REDUCE_SCATTER

# allreduce's ops: lax.psum, pmean, pmax, pmin.
LAX_OPS = {"sum": jax.lax.psum, "mean": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}
OPS = tuple(LAX_OPS)
# What the ring takes (float64, int64, uint64 and complex128 exist only under jax_enable_x64).
SUPPORTED_DTYPES = tuple(jnp.dtype(name) for name in _ffi.element_types())

ring_p = core.Primitive(_ffi.target_name())


def _axis_names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _ring_size(names):
    size = 1
    for name in names:
        size *= jax.lax.axis_size(name)
    return size


def _not_numbers(x):
    """float0 and object arrays: lax's collectives refuse them (all but all_gather of a float0 constant),
    each its own way, so jaxring hands them to lax for the same error (or result)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (dtype == jax.dtypes.float0 or dtype == np.dtype(object))


def _device_names(names):
    """The names among `names` that map devices; the others are vmap's, reduced inside the program (_batch)."""
    devices = _jax_compat.device_axes()
    return tuple(name for name in names if name in devices)


def _checked_axes(axis_name, kind, groups=None):
    """`axis_name` as a tuple, the ring's size (a group's where `groups` splits the axis) and the groups,
    checked as lax checks them, at trace time: no refusal may wait for vmap's batching rule (_batch),
    which may run after the op returned (vmap of a jaxpr traced earlier).

    Only an all-reduce takes a vmap axis among device axes: lax's all_gather and psum_scatter
    refuse one in a tuple, and every op refuses axis_index_groups over a vmap axis."""
    op_name = kind.name
    names = _axis_names(axis_name)
    sizes = _jax_compat.bound_axis_sizes()
    for name in names:
        if name not in sizes:
            raise NameError(
                f"Found an unbound axis name: {name}. To fix this, please call jaxring.{op_name} under "
                f"`jax.shard_map` or `jax.pmap` mapping an axis named {name!r} (or `jax.vmap(..., axis_name={name!r})`)"
            )
    vmapped = [name for name in names if name not in _device_names(names)]
    if vmapped and len(names) > 1 and kind is not ALLREDUCE:
        raise NotImplementedError(
            f"jaxring.{op_name} over {names}, of which {vmapped} is a vmap axis: as lax.{kind.lax_twin}, it runs over "
            "one vmap axis alone or over device axes only; call it once per axis"
        )
    ring = int(np.prod([sizes[name] for name in names]))
    if groups is None:
        return names, ring, None
    groups = _checked_groups(groups, names, ring, op_name, kind is ALLREDUCE)
    if vmapped:
        raise NotImplementedError(
            f"axis_index_groups not supported in vmap collectives (as in jax.lax): jaxring.{op_name} over {names}, "
            f"of which {vmapped} is a vmap axis; map it with jax.pmap or jax.shard_map to split it into groups"
        )
    return names, len(groups[0]), groups


def _checked_groups(groups, names, ring, op_name, sizes_may_differ=False):
    """lax's axis_index_groups as a tuple of tuples: every index of the axis once, in groups of one
    size unless `sizes_may_differ` (an all-reduce: lax sums groups of different sizes on CPU and GPU)."""
    groups = tuple(tuple(int(i) for i in group) for group in groups)
    if sorted(i for group in groups for i in group) != list(range(ring)):
        raise ValueError(
            f"axis_index_groups must cover all indices exactly once: jaxring.{op_name} over {names} "
            f"({ring} devices) got {groups}; list each of 0..{ring - 1} in exactly one group"
        )
    if _sizes_differ(groups) and not sizes_may_differ:
        raise ValueError(
            f"axis_index_groups must all be the same size: jaxring.{op_name} runs one ring per group, "
            f"all of one size, got groups of sizes {[len(group) for group in groups]}"
        )
    return groups


def _sizes_differ(groups) -> bool:
    """Whether lax's axis_index_groups `groups` (or None) hold groups of different sizes."""
    return groups is not None and len({len(group) for group in groups}) > 1


def _is_pytree(x) -> bool:
    """Whether `x` holds leaves in a container (lax's collectives map over them) rather than being one."""
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


def _wider_type(dtype):
    """The type an element type narrower than every type the handlers take crosses the ring in,
    holding each of its values exactly (None where the handlers take `dtype`): floats of under
    16 bits (float8s, float4) in float32, where a sum rounds once, as bfloat16's does; integers of
    under 8 bits in 8 bits, whose wrapped sums wrap alike when cast back."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 16:
        return jnp.dtype(jnp.float32)
    if jnp.issubdtype(dtype, jnp.integer) and jnp.iinfo(dtype).bits < 8:
        return jnp.dtype(jnp.int8 if jnp.issubdtype(dtype, jnp.signedinteger) else jnp.uint8)
    return None


def _as_supported_array(x, op_name):
    x = jnp.asarray(x)
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"jaxring.{op_name} takes arrays of {names}, got {x.dtype}; cast the array first")
    return x


def _timeout_ms(timeout):
    """The handler's timeout attribute: milliseconds, 0 for the default, -1 for none."""
    if timeout is None:
        timeout_lib.default_timeout()  # parses $JAXRING_TIMEOUT_S and hands it to the handlers
        return 0
    seconds = timeout_lib.check(timeout)
    return -1 if seconds == float("inf") else max(1, int(round(seconds * 1000)))


def _canonical_axis(axis, ndim, what, error=ValueError):
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise error(f"{what}={axis!r} is not an axis of a {ndim}-dimensional result or input")
    return int(axis) % ndim


def _ring(flat, *, kind, names, timeout_ms, reduction="sum", groups=None):
    """Binds one ring op on a 1-D array (whether it runs in place is decided at every bind: _in_place).

    `reduction` ("sum", "max", "min") combines the devices' values where the kind reduces;
    `groups` (lax's axis_index_groups, as a tuple of tuples, or None for the whole axis) splits
    the axis into rings. `ranks` counts every name's devices or batch elements, vmap's too
    (_batch takes a vmap axis' share out), or a group's."""
    if _jax_compat.checking_varying_axes():
        _refuse_vmap_axes_when_typed(flat, names, kind)
        flat = kinds.typed_input(flat, names, kind)
    ranks = len(groups[0]) if groups else _ring_size(names)
    return ring_p.bind(flat, kind=kind, axis_name=names, ranks=ranks, op_id=_ring_call.next_op_id(),
                       timeout_ms=timeout_ms, reduction=reduction, groups=groups)


def _refuse_vmap_axes_when_typed(flat, names, kind):
    """Under shard_map(check_vma=True) lax refuses every collective over a vmap axis, which no value's
    type varies over: a sum of a value varying over the tuple's device axes with lax.psum's ValueError,
    anything else on a bare assertion in JAX's pvary (jax 0.10.2). jaxring raises the same classes, with words."""
    vmapped = [name for name in names if name not in _device_names(names)]
    if not vmapped:
        return
    varies = _jax_compat.varying_axes(jax.typeof(flat)).intersection(names)
    error = ValueError if kind.sums and varies else AssertionError
    raise error(
        f"jaxring.{kind.name} over {names} under jax.shard_map(check_vma=True): {vmapped} is a vmap axis, which no "
        f"value's type varies over, and lax.{kind.lax_twin} refuses it there too. Pass check_vma=False to jax.shard_map"
    )


def _ring_of_one(lax_op, local_result):
    """A collective over one device: its local result, computed without a collective.

    Under shard_map(check_vma=True) the result's type must drop the reduced
    axes, which only lax's collectives do; there lax's op runs (a collective
    over a group of one, as a lax user would pay).
    """
    return lax_op() if _jax_compat.checking_varying_axes() else local_result()


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
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    names, ranks, groups = _checked_axes(axis_name, ALLREDUCE, axis_index_groups)
    timeout_ms = _timeout_ms(timeout)
    communicator = _processes(processes)
    _check_allreduce_axes(names, groups, communicator)
    wire_dtype = _checked_wire_dtype(wire_dtype, processes)

    lax_reduce = LAX_OPS[op]
    reduction = "sum" if op == "mean" else op

    def reduce_leaf(leaf):
        if _not_numbers(leaf):
            return lax_reduce(leaf, names, axis_index_groups=groups)
        x = jnp.asarray(leaf)
        if x.dtype == jnp.bool_ and reduction == "sum":  # as lax.psum: booleans are summed as int32 (counted)
            x = x.astype(jnp.int32)
        if (wide := _wider_type(x.dtype)) is not None:
            # As lax's: the reduction lands in the narrow type (an integer sum wrapped in it), and a
            # mean divides that, in that type.
            total = allreduce(x.astype(wide), names, reduction, axis_index_groups=groups, processes=processes,
                              timeout=timeout, wire_dtype=wire_dtype).astype(x.dtype)
            return total / _devices_in_mean(names, ranks, groups, communicator) if op == "mean" else total
        x = _as_supported_array(x, "allreduce")
        if reduction != "sum" and jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise TypeError(f"jaxring.allreduce(op={op!r}) of {x.dtype}: complex numbers have no order, and "
                            f"lax.p{op} refuses them too (XLA has no such reduction); reduce their real and "
                            "imaginary parts, or their absolute values, instead")
        if reduction == "sum":
            x = _unreduced_as_varying(x, names, "allreduce", groups)
        if communicator is not None:
            devices = _device_names(names)
            vmapped = tuple(name for name in names if name not in devices)
            partial = x
            if vmapped:  # the vmap axes' part first, inside the program (_batch), in the accumulation type: rounded once
                partial = allreduce(x.astype(accumulation.accumulation_dtype(x.dtype)), vmapped, reduction,
                                    timeout=timeout)
            total = _across_processes(partial, devices, op, groups, communicator, timeout_ms,
                                      wire_dtype).astype(x.dtype)
            if op == "mean":
                return accumulation.mean(total, _devices_in_mean(names, ranks, groups, communicator))
            return total
        if not isinstance(leaf, jax.core.Tracer):
            # A value no trace computed (a Python or numpy scalar, a constant) is the same on
            # every device: lax sums it when tracing, with no collective, so jaxring does too,
            # to lax's type (a Python scalar stays one).
            return lax_reduce(leaf, names, axis_index_groups=groups)
        lax_op = functools.partial(lax_reduce, x, names, axis_index_groups=groups)
        sizes_differ = _sizes_differ(groups)  # then `ranks` is the first group's size only
        if ranks == 1 and not sizes_differ:
            return _ring_of_one(lax_op, lambda: accumulation.mean(x, 1) if op == "mean" else x)
        if x.size == 0:
            return lax_op()
        if sizes_differ:
            return _within_groups_of_different_sizes(x, names, groups, op, timeout_ms)
        total = _ring(x.reshape(-1), kind=ALLREDUCE, names=names, timeout_ms=timeout_ms, reduction=reduction,
                      groups=groups).reshape(x.shape)
        return accumulation.mean(total, ranks) if op == "mean" else total

    return jax.tree_util.tree_map(reduce_leaf, x)


def _unreduced_as_varying(x, names, op_name, groups):
    """`x` typed unreduced over all of `names` (explicit sharding: each device holds a part of a sum)
    as the varying input of the ring's sum, as lax.psum and psum_scatter take one (their
    unreduced_psum and unreduced_psum_scatter); the transpose types the cotangent reduced. Any other
    value as it is (kinds.typed_input refuses one unreduced over some of `names` only)."""
    if not names or not _jax_compat.checking_varying_axes():
        return x
    if not _jax_compat.axes_in_state(jax.typeof(x), "unreduced").issuperset(names):
        return x
    if groups is not None:
        raise NotImplementedError(f"jaxring.{op_name} of an unreduced value with axis_index_groups: lax refuses it too")
    return kinds.retyped(x, names, "unreduced", "varying")


def _within_groups_of_different_sizes(x, names, groups, op, timeout_ms):
    """allreduce of `x` within each of `groups` where they differ in size (_in_rows_by_group), over
    this process' devices."""
    reduction = "sum" if op == "mean" else op
    own = _in_rows_by_group(x, names, groups, reduction, functools.partial(
        _ring, kind=ALLREDUCE, names=names, timeout_ms=timeout_ms, reduction=reduction))
    return accumulation.mean(own, _devices_in_mean(names, None, groups, None)) if op == "mean" else own


def _in_rows_by_group(x, names, groups, reduction, reduce_whole_axis):
    """`x` reduced within each of `groups` of different sizes by `reduce_whole_axis` (a reduction over
    the whole axis of a 1-D array): one ring holds a row per group, no longer one ring per group.
    Each device puts `x` in its group's row and the reduction's identity in the others (-0.0 for a
    float sum, which leaves every sum's bits as they were), the whole axis reduces every row at once,
    and each device keeps its group's row."""
    mine = _own_group(names, groups)
    rows = jnp.arange(len(groups)).reshape((-1,) + (1,) * x.ndim) == mine
    stacked = jnp.where(rows, x[None], _identity(x.dtype, reduction))
    total = reduce_whole_axis(stacked.reshape(-1)).reshape(stacked.shape)
    return jax.lax.dynamic_index_in_dim(total, mine, keepdims=False)


def _own_group(names, groups):
    """This device's index among `groups` (traced)."""
    return _own_place(names, groups, lambda index, group: index)


def _position_in_own_group(names, groups):
    """This device's position in its group of `groups`, or along `names` where `groups` is None (traced)."""
    if groups is None:
        return jax.lax.axis_index(names)
    return _own_place(names, groups, lambda index, group: np.arange(len(group)))


def _own_place(names, groups, place):
    """`place(index, group)` of this device's group (a number, or one per member of the group), traced."""
    table = np.zeros(sum(map(len, groups)), np.int32)
    for index, group in enumerate(groups):
        table[list(group)] = place(index, group)
    return jnp.asarray(table)[jax.lax.axis_index(names)]


def _devices_in_mean(names, ranks, groups, communicator):
    """What allreduce(op="mean") divides by: the devices of the ring (a group's, traced where the
    groups differ in size) times the processes of `communicator` (None: this one)."""
    processes = 1 if communicator is None else communicator.size
    if _sizes_differ(groups):
        return jnp.asarray([len(group) * processes for group in groups], np.int32)[_own_group(names, groups)]
    return ranks * processes


def _identity(dtype, reduction):
    """The value that leaves `reduction` ("sum", "max", "min") unchanged, in `dtype`."""
    if reduction == "sum":
        return jnp.array(-0.0 if jnp.issubdtype(dtype, jnp.inexact) else 0, dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if reduction == "max" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.array(reduction == "min", dtype)
    return jnp.array(info.min if reduction == "max" else info.max, dtype)


WIRE_DTYPES = ("bfloat16", "float16", "float32")


def _checked_wire_dtype(wire_dtype, processes):
    """allreduce's wire_dtype as a numpy dtype, or None."""
    if wire_dtype is None:
        return None
    name = np.dtype(wire_dtype).name if not isinstance(wire_dtype, str) else wire_dtype
    if name not in WIRE_DTYPES:
        raise ValueError(f"jaxring.allreduce(wire_dtype={wire_dtype!r}): the chunks cross processes as one of "
                         f"{WIRE_DTYPES}, or None for the accumulation type")
    if processes is False:
        raise ValueError(f"jaxring.allreduce(wire_dtype={name!r}) is the dtype of what crosses processes; "
                         "pass processes=True (or a communicator), or drop wire_dtype")
    return np.dtype(jnp.dtype(name))


def _check_allreduce_axes(names, groups, communicator):
    """What allreduce refuses besides lax's refusals (_checked_axes): groups where lax.psum refuses them
    (typed), and processes= outside pmap and shard_map under jax.distributed."""
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


def _processes(processes):
    """The processes `processes=` names (mpi.Communicator), or None where it is this process alone."""
    if isinstance(processes, (bool, np.bool_)):
        processes = bool(processes)
    if processes is False:  # not `not processes`: MPI.COMM_NULL is falsy, and refused by mpi.communicator
        return None
    from jaxring.collectives import mpi  # imports mpi4py: only for processes= other than False

    communicator = mpi.communicator(processes)
    return communicator if communicator.size > 1 else None


def _across_processes(x, names, op, groups, communicator, timeout_ms, wire_dtype):
    """allreduce(processes=...)'s reduction of one leaf over several processes, a mean's sum (`op` is part of
    what every process must agree on, so a sum meeting a mean is refused): the local ring's reduce-scatter,
    the MPI leg over `communicator`'s processes (in `wire_dtype`: mpi.reduce_over_processes says where),
    the local ring's all-gather (mpi.py). With `groups`, each group's local rings run within it and
    the leg of a group's k-th device joins the k-th device of the same group in every process (every
    process runs the same groups); groups of different sizes go as rows (_in_rows_by_group)."""
    from jaxring.collectives import mpi

    devices = _ring_size(names)
    if jax.process_count() > 1 and devices > jax.local_device_count():
        raise ValueError(
            f"jaxring.allreduce(..., processes=...) over {names}: the axis has {devices} devices, more than "
            f"this process' {jax.local_device_count()}, so it spans jax.distributed processes and an allreduce "
            "over it already reduces over them. Drop processes=, or map the axis over jax.local_devices()."
        )

    reduction = "sum" if op == "mean" else op

    def over_processes(flat, ring_groups):
        if flat.size == 0:
            return flat
        what = (f"{op} of {np.dtype(x.dtype).name}{list(x.shape)} over {names}"
                f"{'' if groups is None else f' in groups {groups}'} x {communicator.size} processes")
        local_ops = mpi.LocalOps(
            len(ring_groups[0]) if ring_groups else devices,
            functools.partial(_ring, kind=REDUCE_SCATTER, names=names, timeout_ms=timeout_ms, reduction=reduction,
                              groups=ring_groups),
            functools.partial(_ring, kind=ALL_GATHER, names=names, timeout_ms=timeout_ms, groups=ring_groups),
        )
        return mpi.reduce_over_processes(flat, names, local_ops, timeout_ms, what, communicator, reduction, wire_dtype)

    if _sizes_differ(groups):
        return _in_rows_by_group(x, names, groups, reduction, lambda flat: over_processes(flat, None))
    return over_processes(x, groups)


def reduce_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False, timeout=None):
    """The device's block of the sum of `x` over `axis_name`, as jax.lax.psum_scatter.

    Untiled, `x.shape[scatter_dimension]` must equal the number of devices N
    and the device at axis position r gets sum[..., r, ...] (that dimension
    dropped); tiled, it must be a multiple of N and the device gets the r-th
    of N equal blocks along it. With `axis_index_groups`, N is a group's size and the
    position is within the group. `axis_name` may be one vmap axis, as lax's. A pytree
    is scattered leaf by leaf.
    """
    _ffi.register()  # every op, a ring of one too: the settings' errors come at once
    if _is_pytree(x):
        return jax.tree_util.tree_map(
            lambda leaf: reduce_scatter(leaf, axis_name, scatter_dimension=scatter_dimension,
                                        axis_index_groups=axis_index_groups, tiled=tiled, timeout=timeout), x)
    if _not_numbers(x):
        return jax.lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled,
                                    axis_index_groups=axis_index_groups)
    x = jnp.asarray(x)
    # Out of range, lax.psum_scatter raises IndexError, before it looks at the dtype; numpy's
    # AxisError is one, and the ValueError jaxring raised before.
    if x.ndim == 0:
        raise np.exceptions.AxisError(
            f"jaxring.reduce_scatter of a 0-dimensional x: it scatters blocks of x along "
            f"scatter_dimension={scatter_dimension!r}, as lax.psum_scatter; sum a scalar with jaxring.allreduce"
        )
    dim = _canonical_axis(scatter_dimension, x.ndim, "scatter_dimension", np.exceptions.AxisError)
    names, ranks, groups = _checked_axes(axis_name, REDUCE_SCATTER, axis_index_groups)
    x = _unreduced_as_varying(x, names, "reduce_scatter", groups)
    lax_op = functools.partial(jax.lax.psum_scatter, x, names, scatter_dimension=dim, tiled=tiled,
                               axis_index_groups=groups)
    if x.dtype == jnp.bool_:
        lax_op()  # lax.psum_scatter refuses bools (lax.add does not take them): the same TypeError
    if (wide := _wider_type(x.dtype)) is not None:
        return reduce_scatter(x.astype(wide), names, scatter_dimension=dim, axis_index_groups=groups, tiled=tiled,
                              timeout=timeout).astype(x.dtype)
    x = _as_supported_array(x, "reduce_scatter")
    timeout_ms = _timeout_ms(timeout)
    size = x.shape[dim]
    if (size % ranks if tiled else size != ranks):
        raise ValueError(
            f"reduce_scatter over {ranks} devices needs dimension {dim} of x "
            f"{'to be a multiple of' if tiled else 'to equal'} {ranks}, got shape {x.shape}"
        )
    if ranks == 1:
        return _ring_of_one(lax_op, lambda: x if tiled else jnp.squeeze(x, dim))
    if x.size == 0:
        return lax_op()
    # Device r's block must be the r-th contiguous chunk of the flat buffer.
    blocks = jnp.moveaxis(x, dim, 0)
    mine = _ring(blocks.reshape(-1), kind=REDUCE_SCATTER, names=names, timeout_ms=timeout_ms, groups=groups)
    mine = mine.reshape((size // ranks,) + blocks.shape[1:])
    return jnp.moveaxis(mine, 0, dim) if tiled else mine[0]


ALL_GATHER_TO = ("varying", "invarying", "reduced")  # lax.all_gather's `to`


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying", timeout=None):
    """Every device's `x`, in axis order, stacked along a new `axis` (as jax.lax.all_gather).

    Tiled, the blocks are concatenated along the existing `axis` instead.
    `all_gather(reduce_scatter(x, a, tiled=True), a, tiled=True)` equals `allreduce(x, a)`.
    With `axis_index_groups`, the devices of each group gather each other's `x`.
    `to="invarying"` is the same value; under shard_map(check_vma=True) it is typed
    invariant over the axes and its transpose hands each device its own block of the
    cotangent, as lax's. `to="reduced"` (explicit sharding, under check_vma) types it reduced
    over the axes; its transpose reduce-scatters the unreduced cotangent. A pytree is gathered
    leaf by leaf.
    """
    _ffi.register()  # every op, a ring of one too: the settings' errors come at once
    _check_all_gather_to(to, axis_index_groups)
    if _is_pytree(x):
        return jax.tree_util.tree_map(
            lambda leaf: all_gather(leaf, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled,
                                    to=to, timeout=timeout), x)
    if _not_numbers(x):
        return jax.lax.all_gather(x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled, to=to)
    x = jnp.asarray(x)
    if (wide := _wider_type(x.dtype)) is not None:
        # Moved, not computed: 8-bit floats as their bits (a NaN's payload kept), 4-bit types widened.
        narrow, bits = x.dtype, jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits == 8
        moved = jax.lax.bitcast_convert_type(x, jnp.uint8) if bits else x.astype(wide)
        gathered = all_gather(moved, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled, to=to,
                              timeout=timeout)
        return jax.lax.bitcast_convert_type(gathered, narrow) if bits else gathered.astype(narrow)
    x = _as_supported_array(x, "all_gather")
    timeout_ms = _timeout_ms(timeout)
    names, ranks, groups = _checked_axes(axis_name, ALL_GATHER, axis_index_groups)
    if tiled and x.ndim == 0:
        raise ValueError("all_gather(tiled=True) concatenates along an axis of x; x is a scalar")
    axis = _canonical_axis(axis, x.ndim if tiled else x.ndim + 1, "axis")
    lax_op = functools.partial(jax.lax.all_gather, x, names, axis=axis, tiled=tiled, axis_index_groups=groups, to=to)
    if ranks == 1:
        return _ring_of_one(lax_op, lambda: x if tiled else jnp.expand_dims(x, axis))
    if x.size == 0:
        return lax_op()
    gather = functools.partial(_gathered, names=names, ranks=ranks, groups=groups, timeout_ms=timeout_ms, axis=axis,
                               tiled=tiled)
    if to == "invarying" and _jax_compat.checking_varying_axes():
        return _gathered_invariant(gather, x, names, axis, tiled)
    if to == "reduced":
        if not _jax_compat.checking_varying_axes():
            return lax_op()  # lax refuses it, on a value no type calls varying
        # Varying -> reduced, as lax's all_gather_reduced: the transpose is the ring's reduce-scatter of
        # the (unreduced) cotangent.
        return kinds.retyped(gather(x), names, "varying", "reduced")
    return gather(x)


def _gathered(x, *, names, ranks, groups, timeout_ms, axis, tiled):
    flat = _ring(x.reshape(-1), kind=ALL_GATHER, names=names, timeout_ms=timeout_ms, groups=groups)
    stacked = jnp.moveaxis(flat.reshape((ranks,) + x.shape), 0, axis)
    if not tiled:
        return stacked
    return stacked.reshape(x.shape[:axis] + (ranks * x.shape[axis],) + x.shape[axis + 1 :])


def _gathered_invariant(gather, x, names, axis, tiled):
    """gather(x) typed invariant over `names` (lax.all_gather(to="invarying") under check_vma).

    The gathered value is the same on every device, so its cotangent is too, and each device's
    `x` owns one block of it: the transpose slices that block out, with no communication.
    (kinds.invariant_p's own transpose would hand each device the whole cotangent, as a sum's.)
    """
    x = kinds.typed_input(x, names, ALL_GATHER)  # varying over `names`, as the cotangent's slice will be
    block = x.shape[axis] if tiled else 1

    def gather_invariant(_, x):
        return kinds.invariant_p.bind(gather(x), names=names)

    def own_block(_, cotangent):
        mine = jax.lax.dynamic_slice_in_dim(cotangent, jax.lax.axis_index(names) * block, block, axis)
        return mine if tiled else jnp.squeeze(mine, axis)

    # A custom_jvp whose tangent is a linear_call: forward mode, reverse mode (the tangent's transpose
    # is own_block) and higher orders, as lax's.
    @jax.custom_jvp
    def gathered(x):
        return gather_invariant(None, x)

    @gathered.defjvp
    def _(primals, tangents):
        return gathered(*primals), jax.custom_derivatives.linear_call(gather_invariant, own_block, None, *tangents)

    return gathered(x)


def _check_all_gather_to(to, groups):
    """lax.all_gather's `to`: its values, and the ones jaxring refuses, named, at trace time."""
    if to not in ALL_GATHER_TO:
        raise ValueError(
            f"Got unexpected `to` value for `jaxring.all_gather`: {to!r}. Allowed `to` values are: {ALL_GATHER_TO}"
        )
    if to == "varying":
        return
    if groups is not None:
        raise NotImplementedError(f"jaxring.all_gather(..., to={to!r}) with axis_index_groups: lax refuses it too")


# --- the primitive's rules -------------------------------------------------


def _abstract_eval(x, *, kind, axis_name, ranks, op_id, timeout_ms, in_place, reduction, groups):
    if kind.output_is_block and kind.ring_elements(x.shape[0], ranks) % ranks:
        raise ValueError(f"{kind.name} input of {x.shape[0]} elements is not a multiple of {ranks}")
    shape = (kind.out_elements(x.shape[0], ranks),)
    out = _jax_compat.with_shape_and_varying(x, shape, kinds.output_varying(x, kind, axis_name))
    # Typed as lax's: an untyped psum's result is never weakly typed (psum_p's abstract eval).
    if kind.invariant_output and not _jax_compat.checking_varying_axes():
        return out.update(weak_type=False)
    return out


def _rings(ctx, axis_name, groups):
    """The devices of every ring, [rings, ring size], each ring in axis order; with `groups` (lax's
    axis_index_groups), each axis' devices split into one ring per group, in the group's order."""
    mesh = _jax_compat.spmd_mesh(ctx)
    if mesh is None:
        raise ValueError(
            "jaxring collectives run inside jax.pmap or jax.shard_map; "
            f"axis {axis_name} is not bound by either here"
        )
    names = list(mesh.axis_names)
    for name in axis_name:
        if name not in names:
            raise ValueError(f"axis {name!r} is not an axis of the mesh {tuple(names)}")
    others = [n for n in names if n not in axis_name]
    order = [names.index(n) for n in others] + [names.index(n) for n in axis_name]
    ring = int(np.prod([mesh.shape[n] for n in axis_name]))
    rings = np.transpose(mesh.devices, order).reshape(-1, ring)
    if groups is not None:
        rings = rings[:, np.array(groups)].reshape(-1, len(groups[0]))
    return rings, mesh


def _lowering(ctx, x, *, kind, axis_name, ranks, op_id, timeout_ms, in_place, reduction, groups, platform):
    rings, mesh = _rings(ctx, axis_name, groups)
    if rings.shape[1] != ranks:
        raise ValueError(f"axis {axis_name} has {rings.shape[1]} devices in the mesh but {ranks} when traced")
    if any(len({d.process_index for d in ring}) > 1 for ring in rings):
        if kind is not ALLREDUCE:
            through = functools.partial(_through_allreduce, kind=kind, axis_name=axis_name, ranks=ranks,
                                        timeout_ms=timeout_ms, reduction=reduction, groups=groups)
            return mlir.lower_fun(through, multiple_results=False)(ctx, x)
        from jaxring.collectives import mpi  # imports mpi4py: only for axes that span processes

        return mpi.lower_across_processes(ctx, x, rings, axis_name, timeout_ms, reduction)
    return _ring_call.emit(ctx, x, kind=kind, ordinals=_ring_call.ordinals(rings), op_id=op_id,
                           timeout_ms=timeout_ms, in_place=in_place, platform=platform, reduction=reduction)


def _through_allreduce(flat, *, kind, axis_name, ranks, timeout_ms, reduction, groups):
    """A reduce-scatter or all-gather over an axis that spans jax.distributed processes, where the MPI
    leg runs all-reduces only (mpi.lower_across_processes): a reduce-scatter keeps its block of the
    all-reduce; an all-gather sums a buffer of `ranks` blocks in which each device wrote its own as
    unsigned integers, zeros elsewhere, so every bit arrives. About twice the bytes of a ring's."""
    index = _position_in_own_group(axis_name, groups)
    allreduce = functools.partial(ring_p.bind, kind=ALLREDUCE, axis_name=axis_name, ranks=ranks,
                                  op_id=_ring_call.next_op_id(), timeout_ms=timeout_ms, groups=groups)
    if kind is REDUCE_SCATTER:
        block = flat.size // ranks
        return jax.lax.dynamic_slice_in_dim(allreduce(flat, reduction=reduction), index * block, block)
    bits, restore = _as_unsigned_bits(flat)
    buffer = jnp.zeros((ranks, bits.size), bits.dtype)
    buffer = jax.lax.dynamic_update_index_in_dim(buffer, bits, index, 0)
    return restore(allreduce(buffer.reshape(-1), reduction="sum"))


def _as_unsigned_bits(flat):
    """`flat` (1-D) as unsigned integers holding its bits, and the function that turns a run of such
    buffers back into `flat`'s type (complex numbers as pairs of components, bools as bytes)."""
    dtype = flat.dtype
    if dtype == jnp.bool_:
        return flat.astype(jnp.uint8), lambda bits: bits.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts, restore_parts = _as_unsigned_bits(jnp.stack([flat.real, flat.imag], -1).reshape(-1))
        return parts, lambda bits: jax.lax.complex(*jnp.moveaxis(restore_parts(bits).reshape(-1, 2), 1, 0))
    unsigned = jnp.dtype(f"uint{np.dtype(dtype).itemsize * 8}")
    return (jax.lax.bitcast_convert_type(flat, unsigned),
            lambda bits: jax.lax.bitcast_convert_type(bits, dtype))


def _not_differentiable(reduction, rule):
    """lax.pmax and lax.pmin have no derivative (jax 0.10.2 defines none): neither have jaxring's."""
    if reduction != "sum":
        raise NotImplementedError(
            f"{rule} rule for jaxring.allreduce(op={reduction!r}) not implemented, as lax's for 'p{reduction}' "
            f"is not; pass its input through jax.lax.stop_gradient where no derivative should flow"
        )


def _transpose(cotangent, x, *, kind, axis_name, ranks, op_id, timeout_ms, in_place, reduction, groups):
    _not_differentiable(reduction, "Transpose")
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    if kind.invariant_output and _jax_compat.checking_varying_axes():
        # Typed, the cotangent of a sum is the same on every device: each
        # input receives it whole, no communication (lax.psum's transpose).
        return [jax.lax.pcast(cotangent, axis_name, to="varying")]
    # Untyped, the cotangent may differ between devices, and the transpose of
    # a sum over devices is a sum over devices; reduce_scatter and all_gather
    # are each other's transpose.
    return [
        ring_p.bind(cotangent, kind=kinds.transpose_of(kind), axis_name=axis_name, ranks=ranks,
                    op_id=_ring_call.next_op_id(), timeout_ms=timeout_ms, reduction=reduction, groups=groups)
    ]


def _batch(axis_data, args, dims, *, kind, axis_name, ranks, op_id, timeout_ms, in_place, reduction, groups):
    (x,), (dim,) = args, dims
    params = dict(kind=kind, axis_name=axis_name, ranks=ranks, op_id=op_id, timeout_ms=timeout_ms, in_place=in_place,
                  reduction=reduction, groups=groups)
    if axis_data.name in axis_name:
        return _batch_over_the_vmap_axis(axis_data, x, dim, params)
    if dim is None:  # a value vmap does not batch (a constant): the op as it is, once
        return ring_p.bind(x, **params), None
    # Lay the batch out so that each device's block holds its block of every
    # batch element: [B, N*c] -> [N, B, c] where the output is a block (reduce_scatter),
    # and back where the input is one (all_gather). Elementwise (all-reduce), any layout works.
    x = jnp.moveaxis(x, dim, 0)
    batch, length = x.shape
    if kind.output_is_block:
        x = x.reshape(batch, ranks, length // ranks).transpose(1, 0, 2)
    out = ring_p.bind(x.reshape(-1), **params)
    if kind.input_is_block:
        return out.reshape(ranks, batch, -1).transpose(1, 0, 2).reshape(batch, -1), 0
    return out.reshape(batch, -1), 0


def _batch_over_the_vmap_axis(axis_data, x, dim, params):
    """The op over a vmap axis (lax's batching of psum, psum_scatter, all_gather): the vmap axis'
    part is computed over the batch dimension inside the program, the device axes' part by the ring.

    `dim` None is a value the same for every batch element. The refusals (groups, a vmap axis
    with device axes in a gather or scatter) came at trace time (_checked_axes)."""
    kind, names, size = params["kind"], params["axis_name"], axis_data.size
    devices = tuple(name for name in names if name != axis_data.name)
    if kind is ALLREDUCE:
        partial = _reduce_over_the_batch(x, dim, size, params["reduction"])
        if not devices:
            return partial, None
        return ring_p.bind(partial, **{**params, "axis_name": devices, "ranks": params["ranks"] // size}), None
    assert not devices and params["groups"] is None, (names, params["groups"])
    if kind is ALL_GATHER:  # every batch element's buffer, in batch order: the gathered buffer
        return (jnp.tile(x, size) if dim is None else jnp.moveaxis(x, dim, 0).reshape(-1)), None
    # reduce_scatter: batch element b gets block b of the sum
    return _reduce_over_the_batch(x, dim, size, "sum").reshape(size, -1), 0


def _reduce_over_the_batch(x, dim, size, reduction):
    """`x` reduced over vmap's batch dimension `dim` as lax.psum / pmax / pmin reduce over a vmap axis:
    a value the same for every batch element (`dim` None) sums to `size` times itself."""
    if reduction != "sum":
        return x if dim is None else _BATCH_REDUCTIONS[reduction](x, axis=dim)
    accumulated = accumulation.accumulation_dtype(x.dtype)  # 16-bit floats summed in float32, as the ring does
    total = x.astype(accumulated) * size if dim is None else jnp.sum(x, axis=dim, dtype=accumulated)
    return total.astype(x.dtype)


_BATCH_REDUCTIONS = {"max": jnp.max, "min": jnp.min}


def _in_place(trace, operands, params):
    """An op's output may take its input's buffer where the program computed the input; over the
    program's own input XLA would copy it first, which costs more than the fresh output it
    saves (docs/PERFORMANCE.md). Decided at each bind, from the operand bound there."""
    return {**params, "in_place": _jax_compat.is_computed_in(trace, operands[0])}


_jax_compat.decide_params_at_every_bind(ring_p, _in_place)
ring_p.def_abstract_eval(_abstract_eval)
ad.deflinear2(ring_p, _transpose)
_linear_jvp = ad.primitive_jvps[ring_p]


def _jvp(primals, tangents, **params):
    _not_differentiable(params["reduction"], "Differentiation")
    return _linear_jvp(primals, tangents, **params)


ad.primitive_jvps[ring_p] = _jvp
batching.fancy_primitive_batchers[ring_p] = _batch
mlir.register_lowering(ring_p, lambda ctx, x, **p: _lowering(ctx, x, platform="cpu", **p), platform="cpu")
mlir.register_lowering(ring_p, lambda ctx, x, **p: _lowering(ctx, x, platform="cuda", **p), platform="cuda")
jax_tools.register(ring_p, kinds.invariant_p, kinds.retyped_p)
