"""Run by test_mpi_communicators.py under `mpirun -np P python -m mpi4py`, each rank seeing L host devices.

The cross-process leg over every dtype and op lax takes, over the whole job and over
communicators split from it, and next to mpi4jax in one program. As mpi_workers/collectives.py:
every check passes on every rank or raises (and `python -m mpi4py` aborts the job), each rank
prints "PASS rank <rank> <check>". 64-bit types are on (jax_enable_x64) in this process only.
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jaxring  # noqa: E402
from jaxring.collectives import mpi, topology  # noqa: E402

SEED = 20261128
AXIS = "i"
SHAPE = (3, 37)  # odd: the leg's chunks and the ring's pieces do not divide it
DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64, jnp.complex64, jnp.complex128, jnp.int8, jnp.int16,
          jnp.int32, jnp.int64, jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64, jnp.bool_]
OPS = ("sum", "mean", "max", "min")
LAX = {"sum": jax.lax.psum, "mean": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}
# Where every process holds NaN in the max/min cases: lax's CPU result is -inf (max) or inf (min).
ALL_NAN = (0, 5)

world = topology.init()
L = len(world.local_devices)


def passed(check):
    print(f"PASS rank {world.rank} {check}", flush=True)


def is_float(dtype):
    return jnp.issubdtype(dtype, jnp.floating)


def data(rank, case, dtype, ordered, shape=SHAPE, devices=L):
    """Rank `rank`'s input (a row per device of its `devices`), never all zeros. 16-bit floats lie in
    +-[0.5, 4), so float32 sums of them are exact and the result is the exact sum rounded once.
    `ordered` (max/min): floats get NaNs, infinities and signed zeros, and NaN at ALL_NAN everywhere."""
    rng = np.random.default_rng([SEED, rank, case])
    size = (devices, *shape)
    if dtype == jnp.bool_:
        return rng.integers(0, 2, size).astype(bool)
    if jnp.issubdtype(dtype, jnp.integer):  # the whole range: sums wrap around
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (rng.standard_normal(size) + 1j * rng.standard_normal(size)).astype(dtype)
    if np.dtype(dtype).itemsize == 2:
        x = rng.choice([-1, 1], size) * rng.uniform(0.5, 4, size)
    else:
        x = rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)
    if ordered:
        flat = x.reshape(devices, -1)
        specials = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], flat.shape)
        flat[:] = np.where(rng.random(flat.shape) < 0.2, specials, flat)
        flat[:, list(ALL_NAN)] = np.nan
    return x.astype(dtype)


def reference(op, dtype, rows):
    """lax's result from `rows` (every device's input, stacked), in numpy: integers wrap, NaNs skipped."""
    if op in ("max", "min"):
        if is_float(dtype):
            wide = rows.astype(np.float64)
            rows = np.where(np.isnan(wide), -np.inf if op == "max" else np.inf, wide)
        return rows.max(0) if op == "max" else rows.min(0)
    if dtype == jnp.bool_:
        rows = rows.astype(np.int32)
    if not (is_float(dtype) or jnp.issubdtype(dtype, jnp.complexfloating)):
        total = rows.sum(0, dtype=rows.dtype)  # wraps as lax.psum
        return total if op == "sum" else total.astype(np.float64) / len(rows)
    wide = rows.astype(np.complex128 if jnp.issubdtype(dtype, jnp.complexfloating) else np.float64)
    return wide.sum(0) / (len(rows) if op == "mean" else 1)


def assert_close(name, got, want, dtype, rows, op):
    """Exact where the result is (integers, max/min, 16-bit sums), else within a rounding per term."""
    got = np.asarray(got)
    exact_sum = op == "sum" and not (is_float(dtype) or jnp.issubdtype(dtype, jnp.complexfloating))
    if op in ("max", "min") or exact_sum:
        assert np.array_equal(got, np.broadcast_to(want.astype(got.dtype), got.shape)), (name, got[0], want)
        return
    if op == "sum" and np.dtype(dtype).itemsize == 2 and is_float(dtype):
        assert got.tobytes() == np.broadcast_to(want.astype(dtype), got.shape).tobytes(), (name, got[0], want)
        return
    eps = float(jnp.finfo(got.dtype).eps)
    magnitude = np.abs(rows.astype(np.complex128)).sum(0) / (len(rows) if op == "mean" else 1)
    error = np.abs(got.astype(np.complex128) - want)
    assert (error <= len(rows) * eps * magnitude + 1e-300).all(), (name, error.max(), got[0], want)


def matrix():
    """(name, case, dtype, op) of every dtype and op lax takes (complex max/min: check_refusals)."""
    cases = []
    for i, dtype in enumerate(DTYPES):
        for op in OPS:
            if not (op in ("max", "min") and jnp.issubdtype(dtype, jnp.complexfloating)):
                cases.append((f"{op} {np.dtype(dtype).name}", 10 * i + OPS.index(op), dtype, op))
    return cases


def check_matrix_over(comm, processes, label, cases, devices=world.local_devices):
    """`cases` (of `matrix`) in one program over this process' `devices` and `processes` (True or a
    communicator whose processes are `comm`'s), with the leg one-shot and then as a ring of 12-byte
    pieces (there without the means, whose leg is the sum's: a program less to compile)."""
    defaults = mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES
    try:
        for algorithm, settings in {"one-shot": defaults, "ring": (0, 12)}.items():
            mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = settings
            cases = [case for case in cases if algorithm == "one-shot" or case[3] != "mean"]
            tree = {name: data(world.rank, case, dtype, op in ("max", "min"), devices=len(devices))
                    for name, case, dtype, op in cases}
            ops = {name: op for name, _, _, op in cases}
            program = jax.pmap(lambda t: {k: jaxring.allreduce(v, AXIS, ops[k], processes=processes)
                                          for k, v in t.items()}, AXIS, devices=devices)
            out = program(tree)
            lax_types = jax.eval_shape(jax.pmap(lambda t: {k: LAX[ops[k]](v, AXIS) for k, v in t.items()}, AXIS,
                                                devices=devices), tree)
            for name, case, dtype, op in cases:
                rows = np.concatenate(comm.allgather(tree[name]))
                got = np.asarray(out[name])
                assert got.dtype == lax_types[name].dtype, (label, algorithm, name, got.dtype)
                assert got.shape == (len(devices), *SHAPE), (label, algorithm, name, got.shape)
                # Every device of every process: the same bits.
                assert len({row.tobytes() for row in np.concatenate(comm.allgather(got))}) == 1, (label, name)
                assert_close(f"{label} {algorithm} {name}", got, reference(op, dtype, rows), dtype, rows, op)
    finally:
        mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = defaults


def check_matrix():
    """Every dtype x op over the whole job (processes=True)."""
    check_matrix_over(MPI.COMM_WORLD, True, "job", matrix())
    passed("matrix")


def split_2x2():
    """4 processes as two data-parallel groups: rows {0, 1} and {2, 3}, columns {0, 2} and {1, 3}."""
    job = MPI.COMM_WORLD
    return job.Split(world.rank // 2, world.rank), job.Split(world.rank % 2, world.rank)


def check_nans_on_one_device():
    """Float max and min over the job from one device per process: the NaNs reach the leg itself (a
    local ring of several devices leaves one only where all were NaN, as -inf or inf)."""
    cases = [case for case in matrix() if is_float(case[2]) and case[3] in ("max", "min")]
    check_matrix_over(MPI.COMM_WORLD, True, "one device", cases, world.local_devices[:1])
    passed("nans_on_one_device")


def check_with_mpi4jax_queued():
    """One jitted program per step: jaxring's mean over the row, mpi4jax's sum over the column (the
    user's communicator, handed to both), jaxring's max over the column and sum over the job; 24
    steps queued before any is read, values changing per step, against numpy on the gathered inputs."""
    import mpi4jax

    rows, cols = split_2x2()
    mesh = Mesh(np.array(world.local_devices[:1]), (AXIS,))

    def over(op, processes):  # x: [1 device, ...]
        return jax.shard_map(lambda v: jaxring.allreduce(v, AXIS, op, processes=processes),
                             mesh=mesh, in_specs=P(AXIS), out_specs=P())

    @jax.jit
    def step(w, x, k):
        g = over("mean", rows)(x * k)
        m = mpi4jax.allreduce(g, op=MPI.SUM, comm=cols)
        top = over("max", cols)(x - k)
        total = over("sum", True)(x + k)
        return w - 0.01 * (m + top) + 0.001 * total, (g, m, top, total)

    x = data(world.rank, 900, jnp.float32, False, (4, 9))
    w = jnp.zeros_like(x)
    queued = []
    for k in range(1, 25):
        w, parts = step(w, x, jnp.float32(k))
        queued.append(parts)
    every = np.stack(MPI.COMM_WORLD.allgather(x)).astype(np.float64)  # by rank
    group, column = [2 * (world.rank // 2), 2 * (world.rank // 2) + 1], [world.rank % 2, world.rank % 2 + 2]
    want_w = np.zeros(x.shape)
    for k, (g, m, top, total) in enumerate(queued, start=1):
        want_g = every[group].mean(0) * k
        # mpi4jax sums the columns' row means: rows {0, 1} and {2, 3} together
        want_m = (every[[0, 1]].mean(0) + every[[2, 3]].mean(0)) * k
        want_top = every[column].max(0) - k
        want_total = every.sum(0) + 4 * k
        want_w = want_w - 0.01 * (want_m + want_top) + 0.001 * want_total
        for name, got, want in [("g", g, want_g), ("m", m, want_m), ("max", top, want_top),
                                ("sum", total, want_total)]:
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5 * k,
                                       err_msg=f"step {k} {name}")
    np.testing.assert_allclose(np.asarray(w, np.float64), want_w, rtol=1e-4, atol=1e-4)
    passed("with_mpi4jax_queued")


GROUPS = {"equal": [[0, 2], [1, 3]], "uneven": [[3], [0, 1, 2]]}  # of 4 local devices


def check_groups():
    """allreduce within axis_index_groups of this process' 4 devices and across the processes (True, and
    the job as a communicator): the group's devices of every process, against numpy on them. Groups of
    one size run a ring per group and the leg per device; of different sizes, rows of the whole axis.
    8 steps queued, values changing per step, every leg algorithm, every device of a group the same bits."""
    assert L == 4, L
    cases = [case for case in matrix() if np.dtype(case[2]).name in ("float32", "float64", "bfloat16", "int32",
                                                                   "uint8")]
    defaults = mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES
    try:
        for (kind, groups), processes in zip(GROUPS.items(), (True, MPI.COMM_WORLD)):
            for algorithm, settings in {"one-shot": defaults, "ring": (0, 12)}.items():
                mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = settings
                tree = {name: data(world.rank, 500 + case, dtype, op in ("max", "min")) for name, case, dtype, op in cases}
                ops = {name: op for name, _, _, op in cases}

                def step(t, k, groups=groups, processes=processes):
                    return {name: jaxring.allreduce(v * k.astype(v.dtype), AXIS, ops[name], axis_index_groups=groups,
                                                    processes=processes) for name, v in t.items()}

                program = jax.pmap(step, AXIS)

                queued = [program(tree, jnp.full(L, k, jnp.int32)) for k in (1, 2, 3, 1, 2, 3, 1, 2)]
                every = {name: np.stack(MPI.COMM_WORLD.allgather(v)) for name, v in tree.items()}  # [process, device, ...]
                for k, out in zip((1, 2, 3, 1, 2, 3, 1, 2), queued):
                    for name, _, dtype, op in cases:
                        got = np.asarray(out[name])
                        gathered = np.stack(MPI.COMM_WORLD.allgather(got))
                        for group in groups:
                            rows = (every[name][:, group] * np.asarray(k).astype(every[name].dtype)).reshape(-1, *SHAPE)
                            assert len({gathered[p, d].tobytes() for p in range(world.size) for d in group}) == 1, \
                                (kind, algorithm, name, group)
                            assert_close(f"groups {kind} {algorithm} {name} step x{k} {group}", got[group],
                                         reference(op, dtype, rows), dtype, rows, op)
    finally:
        mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = defaults
    passed("groups")


def check_vmap_axes():
    """processes=True over a vmap axis and the device axis, in either order (lax's batching of the vmap
    axis' part, then the leg): every op on float32, int32 and bfloat16 against numpy on every row of
    every device of every process, a 16-bit sum rounded once."""
    cases = [case for case in matrix() if np.dtype(case[2]).name in ("float32", "int32", "bfloat16")]
    for axes in ((AXIS, "j"), ("j", AXIS)):
        tree = {name: data(world.rank, 700 + case, dtype, op in ("max", "min"), shape=(3, *SHAPE))
                for name, case, dtype, op in cases}
        ops = {name: op for name, _, _, op in cases}
        program = jax.pmap(jax.vmap(lambda t, a=axes: {k: jaxring.allreduce(v, a, ops[k], processes=True)
                                                        for k, v in t.items()}, axis_name="j"), AXIS)
        out = program(tree)
        for name, _, dtype, op in cases:
            by_device = np.concatenate(MPI.COMM_WORLD.allgather(tree[name]))  # [device, vmap element, ...]
            rows = by_device.reshape(-1, *SHAPE)
            want = reference(op, dtype, rows)
            if op in ("max", "min") and is_float(dtype):
                # As lax's: the vmap axis' part is XLA's max (a NaN wins), the devices' part lax's CPU rule.
                want = reference(op, dtype, getattr(np, op)(by_device.astype(np.float64), axis=1))
            got = np.asarray(out[name]).reshape(-1, *SHAPE)
            assert_close(f"vmap axes {axes} {name}", got, want, dtype, rows, op)
    passed("vmap_axes")


def check_without_device_axes():
    """processes= naming no device axis, as mpi4jax's users call MPI inside jit: every dtype x op in a jit
    program on one device (both leg algorithms, lax's types), outside jit, over vmap axes alone, under
    shard_map naming none of its axes (each device meets the same device of every process), its
    gradient, tree_allreduce, float16 on the wire, next to mpi4jax in one program with 16 steps queued;
    against numpy on every process' values. A jit that JAX partitions over several devices is refused
    when compiled."""
    defaults = mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES
    cases = matrix()
    ops = {name: op for name, _, _, op in cases}
    try:
        for algorithm, settings in {"one-shot": defaults, "ring": (0, 12)}.items():
            mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = settings
            tree = {name: data(world.rank, 300 + case, dtype, op in ("max", "min"), devices=1)[0]
                    for name, case, dtype, op in cases}
            out = jax.jit(lambda t: {k: jaxring.allreduce(v, (), ops[k], processes=True) for k, v in t.items()})(tree)
            # lax's types over an axis (over none, lax.psum keeps a bool a bool: it sums nothing)
            lax_types = jax.eval_shape(jax.vmap(lambda t: {k: LAX[ops[k]](v, "j") for k, v in t.items()},
                                                axis_name="j"), jax.tree.map(lambda v: v[None], tree))
            for name, _, dtype, op in cases:
                rows = np.stack(MPI.COMM_WORLD.allgather(tree[name]))
                got = np.asarray(out[name])
                assert got.dtype == lax_types[name].dtype and got.shape == SHAPE, (algorithm, name, got.dtype)
                assert len(set(MPI.COMM_WORLD.allgather(got.tobytes()))) == 1, (algorithm, name)
                assert_close(f"no device axis {algorithm} {name}", got, reference(op, dtype, rows), dtype, rows, op)
    finally:
        mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = defaults

    # tree_allreduce: the leaves fused into buckets of 64 bytes, then the leg per bucket.
    tree = {"f": data(world.rank, 305, jnp.float32, False, devices=1)[0], "i": data(world.rank, 306, jnp.int16, False,
                                                                                  devices=1)[0]}
    out = jax.jit(lambda t: jaxring.tree_allreduce(t, (), processes=True, bucket_bytes=64))(tree)
    for name, dtype in (("f", jnp.float32), ("i", jnp.int16)):
        rows = np.stack(MPI.COMM_WORLD.allgather(tree[name]))
        assert_close(f"tree_allreduce {name}", out[name], reference("sum", dtype, rows), dtype, rows, "sum")

    # In 16 bits on the wire: each hop adds in float32 and rounds to float16 (mpi.py).
    x = data(world.rank, 309, jnp.float32, False, devices=1)[0]
    rows = np.stack(MPI.COMM_WORLD.allgather(x)).astype(np.float64)
    got = jax.jit(lambda v: jaxring.allreduce(v, (), processes=True, wire_dtype="float16"))(x)
    scale = np.abs(rows).sum(0)
    assert (np.abs(np.asarray(got, np.float64) - rows.sum(0)) <= 2 * 2.0 ** -11 * scale + 6e-8 * len(rows)).all()
    assert len(set(MPI.COMM_WORLD.allgather(np.asarray(got).tobytes()))) == 1
    in_float32 = jax.jit(lambda v: jaxring.allreduce(v, (), processes=True))(x)
    assert (np.asarray(got) != np.asarray(in_float32)).any(), "float16 on the wire rounded nothing"

    # Outside jit: compiled alone, once per shape.
    for case, dtype, op in ((310, jnp.float64, "sum"), (311, jnp.int8, "max"), (312, jnp.complex64, "mean")):
        x = data(world.rank, case, dtype, False, devices=1)[0]
        rows = np.stack(MPI.COMM_WORLD.allgather(x))
        for _ in range(2):
            got = jaxring.allreduce(jnp.asarray(x), (), op, processes=True)
            assert_close(f"eager {op} {np.dtype(dtype).name}", got, reference(op, dtype, rows), dtype, rows, op)

    # Over vmap axes alone, one and two: the vmap part inside the program, then the leg.
    vmapped = [case for case in cases if np.dtype(case[2]).name in ("float32", "int32", "bfloat16")]
    tree = {name: data(world.rank, 320 + case, dtype, op in ("max", "min"), shape=(2, 3, *SHAPE), devices=1)[0]
            for name, case, dtype, op in vmapped}

    def over(axes):  # x: [j, k, ...]
        return jax.jit(jax.vmap(jax.vmap(lambda t: {k: jaxring.allreduce(v, axes, ops[k], processes=True)
                                                    for k, v in t.items()}, axis_name="k"), axis_name="j"))

    for axes, program in (("k", over("k")), (("j", "k"), over(("j", "k")))):
        out = program(tree)
        for name, _, dtype, op in vmapped:
            every = np.stack(MPI.COMM_WORLD.allgather(tree[name]))  # [process, j, k, ...]
            for j in range(2):
                # The rows one result reduces: every process' k's (of this j, or of every j).
                group = every[:, j:j + 1] if axes == "k" else every
                rows = group.reshape(-1, *SHAPE)
                want = reference(op, dtype, rows)
                if op in ("max", "min") and is_float(dtype):
                    # As lax's: the vmap axes' part is XLA's max (a NaN wins), the processes' part lax's CPU rule.
                    want = reference(op, dtype, getattr(np, op)(group.astype(np.float64), axis=(1, 2)))
                assert_close(f"vmap {axes} {name} j={j}", np.asarray(out[name])[j], want, dtype, rows, op)

    # Under shard_map over this process' devices, naming none: device d meets device d of every process.
    mesh = Mesh(np.array(world.local_devices), (AXIS,))
    x = data(world.rank, 330, jnp.float32, False, devices=L)
    every = np.stack(MPI.COMM_WORLD.allgather(x)).astype(np.float64)  # [process, device, ...]
    for check_vma in (True, False):
        f = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, (), processes=True), mesh=mesh, in_specs=P(AXIS),
                                  out_specs=P(AXIS), check_vma=check_vma))
        np.testing.assert_allclose(np.asarray(f(x), np.float64), every.sum(0), rtol=1e-5, atol=1e-5)

    # The gradient of a sum across processes is the sum of the cotangents.
    w = data(world.rank, 331, jnp.float32, False, devices=1)[0]
    weights = np.stack(MPI.COMM_WORLD.allgather(w)).astype(np.float64)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(jaxring.allreduce(v, (), processes=True) * w)))(jnp.ones(SHAPE))
    np.testing.assert_allclose(np.asarray(grad, np.float64), weights.sum(0), rtol=1e-5, atol=1e-5)

    # Next to mpi4jax over the same communicator, steps queued, values changing per step.
    import mpi4jax

    @jax.jit
    def step(p, v, k):
        mean = jaxring.allreduce(v * k, (), "mean", processes=MPI.COMM_WORLD)
        total = mpi4jax.allreduce(v + k, op=MPI.SUM, comm=MPI.COMM_WORLD)
        top = jaxring.allreduce(v - k, (), "max", processes=True)
        return p - 0.01 * (mean + top) + 0.001 * total, (mean, total, top)

    v = data(world.rank, 332, jnp.float32, False, (4, 9), devices=1)[0]
    p = jnp.zeros_like(v)
    queued = []
    for k in range(1, 17):
        p, parts = step(p, v, jnp.float32(k))
        queued.append(parts)
    every = np.stack(MPI.COMM_WORLD.allgather(v)).astype(np.float64)
    want_p = np.zeros(v.shape)
    for k, (mean, total, top) in enumerate(queued, start=1):
        wants = every.mean(0) * k, every.sum(0) + world.size * k, every.max(0) - k
        for label, got, want in zip(("mean", "mpi4jax sum", "max"), (mean, total, top), wants):
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5 * k,
                                       err_msg=f"step {k} {label}")
        want_p = want_p - 0.01 * (wants[0] + wants[2]) + 0.001 * wants[1]
    np.testing.assert_allclose(np.asarray(p, np.float64), want_p, rtol=1e-4, atol=1e-4)

    # A jit that JAX partitions over this process' devices: refused when compiled, naming shard_map.
    spread = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(AXIS)))
    try:
        jax.jit(lambda v: jaxring.allreduce(v, (), processes=True))(spread)
    except NotImplementedError as e:
        assert f"partitions over {L} devices" in str(e) and "jax.shard_map" in str(e), str(e)
    else:
        raise AssertionError("a jit partitioned over several devices was not refused")
    passed("without_device_axes")


def check_refusals():
    """Bad communicators and complex max are refused at trace time, naming what to do; a process
    outside a communicator is refused while its members go on (a 3-process leg)."""
    x = data(world.rank, 950, jnp.float32, False, (5,))

    def refused(processes, error, words, op="sum", value=x):
        try:
            jax.pmap(lambda v: jaxring.allreduce(v, AXIS, op, processes=processes), AXIS)(value)
        except error as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"processes={processes!r} op={op} was not refused")

    refused(3, TypeError, "processes= takes True, False or an mpi4py communicator")
    refused(MPI.COMM_NULL, ValueError, "this process is not in the communicator")
    refused(True, TypeError, "complex numbers have no order", "max", data(world.rank, 951, jnp.complex64, False, (5,)))
    rows, _ = split_2x2()
    other_leader = 2 if world.rank < 2 else 0
    between = rows.Create_intercomm(0, MPI.COMM_WORLD, other_leader, 7)
    refused(between, ValueError, "intercommunicator")
    three = MPI.COMM_WORLD.Split(0 if world.rank < 3 else MPI.UNDEFINED, world.rank)
    if world.rank == 3:
        refused(three, ValueError, "this process is not in the communicator")
    else:
        out = jax.pmap(lambda v: jaxring.allreduce(v, AXIS, "mean", processes=three), AXIS)(x)
        rows_of_three = np.concatenate(three.allgather(x)).astype(np.float64)
        np.testing.assert_allclose(np.asarray(out, np.float64), np.broadcast_to(rows_of_three.mean(0), x.shape),
                                   rtol=1e-6, atol=1e-6)
    MPI.COMM_WORLD.Barrier()
    passed("refusals")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"check_{name}"]()
