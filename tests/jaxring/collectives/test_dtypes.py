"""Every dtype lax's collectives take, through every jaxring op, against jax.lax on the same devices.

Integers and max/min bit for bit (integer sums wrap: the values span each type's whole range);
float sums against math.fsum within the bound of a sum in rank order in the accumulation type,
rounded once; complex numbers per component; result dtypes always lax's. Under jax_enable_x64,
which the 64-bit types need.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxring
from tests.jaxring.collectives.test_cpu_engine import path  # noqa: F401 (the fixture that forces a path)

FLOATS = ("float32", "bfloat16", "float16", "float64")
COMPLEX = ("complex64", "complex128")
INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES = FLOATS + COMPLEX + INTEGERS + ("bool",)
SIZES = (1, 7, 1001)
ORDERED_OPS = ("max", "min")


def random_values(rng, shape, dtype):
    """Integers over their whole range (sums wrap), bools, floats of both signs with NaN, -0.0, +0.0
    and infinities mixed in (max/min must treat them as lax does), complex numbers of such floats."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        x = np.empty(shape, dtype)
        x.real, x.imag = random_values(rng, shape, np.float64), random_values(rng, shape, np.float64)
        return x
    x = rng.standard_normal(shape) * 100
    specials = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf])
    x = np.where(rng.random(shape) < 0.15, rng.choice(specials, size=shape), x)
    return x.astype(dtype)


def finite(x):
    """`x` with every special value replaced by a finite one, for sums (lax's NaN payloads are XLA's)."""
    x = np.asarray(x)
    return np.where(np.isfinite(x), x, np.asarray(1.5, x.dtype))


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and (a.view(np.uint8) == b.view(np.uint8)).all()


def ops(module_ops, ranks):
    """The program of every op on each pair of arrays: allreduce's four, reduce_scatter, all_gather;
    sums of the finite twin (`sum_xs`), max, min and all_gather of the array with special values."""
    allreduce, reduce_scatter, all_gather = module_ops

    def program(xs, sum_xs):
        out = []
        for x, s in zip(xs, sum_xs):
            ordered = [] if jnp.issubdtype(x.dtype, jnp.complexfloating) else [allreduce(x, op) for op in ORDERED_OPS]
            summed = [] if s.dtype == jnp.bool_ else [reduce_scatter(s)]
            out.append((allreduce(s, "sum"), allreduce(s, "mean"), *ordered, *summed, all_gather(x)))
        return out

    return jax.pmap(program, axis_name="i", devices=jax.devices()[:ranks])


JAXRING_OPS = (lambda x, op: jaxring.allreduce(x, "i", op=op),
               lambda x: jaxring.reduce_scatter(x, "i", tiled=True),
               lambda x: jaxring.all_gather(x, "i"))
LAX = {"sum": jax.lax.psum, "mean": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}
LAX_OPS = (lambda x, op: LAX[op](x, "i"),
           lambda x: jax.lax.psum_scatter(x, "i", tiled=True),
           lambda x: jax.lax.all_gather(x, "i"))


def sum_bound(x, dtype):
    """|computed - exact| for a sum of the rows of `x` (float64 copies) in rank order in the accumulation
    type, rounded once to `dtype`: (n-1) units of the accumulation type on the sum of magnitudes, plus half
    a unit of `dtype` on the result."""
    unit = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}[dtype]
    accumulation_unit = 2.0**-53 if dtype == "float64" else 2.0**-24
    magnitudes = np.abs(x).sum(0)
    return (len(x) - 1) * accumulation_unit * magnitudes + unit * magnitudes + 1e-300


def check_sum(mine, x, dtype):
    """Each element of `mine` (a float or complex sum of the rows of `x`) against math.fsum."""
    parts = (np.real, np.imag) if jnp.issubdtype(x.dtype, jnp.complexfloating) else (np.real,)
    component = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    for part in parts:
        rows = part(np.asarray(x)).astype(np.float64)
        exact = np.array([math.fsum(column) for column in rows.T])
        error = np.abs(part(np.asarray(mine)).astype(np.float64) - exact)
        bound = sum_bound(rows, component)
        assert (error <= bound).all(), f"{dtype} sum off by {error.max()} (bound {bound[error.argmax()]})"


def check_every_op(ranks, dtype, sizes):
    rng = np.random.default_rng([ranks, DTYPES.index(dtype)])
    xs = tuple(random_values(rng, (ranks, ranks * n), dtype) for n in sizes)
    sum_xs = tuple(x if dtype == "bool" or jnp.issubdtype(x.dtype, jnp.integer) else finite(x) for x in xs)
    mine = jax.tree.map(np.asarray, ops(JAXRING_OPS, ranks)(xs, sum_xs))
    lax = jax.tree.map(np.asarray, ops(LAX_OPS, ranks)(xs, sum_xs))
    exact_sums = dtype == "bool" or dtype in INTEGERS
    for x, s, mine_ops, lax_ops in zip(xs, sum_xs, mine, lax):
        assert [a.dtype for a in mine_ops] == [b.dtype for b in lax_ops], "result dtypes differ from lax's"
        total, mean, *rest = mine_ops
        lax_total, lax_mean, *lax_rest = lax_ops
        for r in range(ranks):
            assert same_bits(total[r], total[0]) and same_bits(mean[r], mean[0]), "replicas differ"
        if exact_sums:
            assert same_bits(total, lax_total)
            assert same_bits(mean, lax_mean)  # an integer total divided as lax.pmean divides it
        else:
            check_sum(total[0], s, dtype)
            # the sum divided (XLA multiplies by 1/n) in the accumulation type, rounded once
            exact_mean = total.astype(np.complex128) / ranks
            np.testing.assert_allclose(mean.astype(np.complex128), exact_mean, rtol=2 * jnp.finfo(total.dtype).eps)
        ordered = 0 if dtype in COMPLEX else len(ORDERED_OPS)
        for a, b in zip(rest[:ordered], lax_rest[:ordered]):
            assert same_bits(a, b), f"{dtype} max/min differ from lax's"
        if dtype != "bool":
            scattered, lax_scattered = rest[ordered], lax_rest[ordered]
            if exact_sums:
                assert same_bits(scattered, lax_scattered)
            else:
                check_sum(scattered.reshape(-1), s, dtype)
        assert same_bits(rest[-1], lax_rest[-1]), "all_gather moves bits; it must not change them"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_of_every_dtype_is_lax_s(dtype):
    with jax.enable_x64(True):
        check_every_op(3, dtype, SIZES)


@pytest.mark.parametrize("ranks", (2, 4))
@pytest.mark.parametrize("dtype", ("float64", "complex64", "int8", "uint64", "bool"))
def test_other_ring_sizes(ranks, dtype):
    with jax.enable_x64(True):
        check_every_op(ranks, dtype, (5,))


@pytest.mark.parametrize("name", ("ring", "one_shot", "push"))
@pytest.mark.parametrize("dtype", ("float64", "complex128", "int16", "uint8"))
def test_each_cpu_engine_path(path, name, dtype):  # noqa: F811 (path is the fixture)
    path(name)
    with jax.enable_x64(True):
        check_every_op(3, dtype, (1, 333))


def test_without_x64_the_64_bit_types_are_their_32_bit_twins():
    x = np.arange(6, dtype=np.int64).reshape(2, 3) - 2
    out = jax.pmap(lambda v: (jaxring.allreduce(v, "i", op="max"), jaxring.allreduce(v, "i", op="mean")),
                   axis_name="i", devices=jax.devices()[:2])(x)
    lax = jax.pmap(lambda v: (jax.lax.pmax(v, "i"), jax.lax.pmean(v, "i")), axis_name="i",
                   devices=jax.devices()[:2])(x)
    for a, b in zip(out, lax):
        assert same_bits(a, b)


def test_shard_map_takes_every_dtype_as_lax_does():
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    spec = jax.sharding.PartitionSpec("i")
    with jax.enable_x64(True):
        for dtype in ("int8", "float64", "complex64", "bool"):
            op = "sum" if dtype == "complex64" else "max"
            x = random_values(np.random.default_rng(5), (4 * 9,), dtype)
            x = jax.device_put(finite(x) if op == "sum" else x, jax.sharding.NamedSharding(mesh, spec))

            def program(reduce, gather):
                return jax.jit(jax.shard_map(lambda v: (reduce(v), gather(v)), mesh=mesh, in_specs=spec,
                                             out_specs=(jax.sharding.PartitionSpec(), spec)))

            mine = program(lambda v: jaxring.allreduce(v, "i", op=op), lambda v: jaxring.all_gather(v, "i"))(x)
            lax = program(lambda v: LAX[op](v, "i"), lambda v: jax.lax.all_gather(v, "i"))(x)
            if op == "sum":
                check_sum(np.asarray(mine[0]), np.asarray(x).reshape(4, 9), dtype)
            else:
                assert same_bits(mine[0], lax[0])
            assert same_bits(mine[1], lax[1])
            assert [jax.typeof(a) for a in mine] == [jax.typeof(b) for b in lax]


def outcome(fn):
    """What running `fn` gives: ("ok", result dtype) or (exception class, message)."""
    try:
        return "ok", jax.tree.map(lambda a: a.dtype, fn())
    except Exception as e:  # noqa: BLE001 (the exception is what is compared)
        return type(e), str(e).split("\n")[0]


@pytest.mark.parametrize("const", (np.zeros((2,), jax.dtypes.float0), np.array([1, "a"], dtype=object)),
                         ids=("float0", "object"))
def test_float0_and_object_arrays_get_lax_s_refusal(const):
    pairs = [(lambda c: jaxring.allreduce(c, "i", op=op), lambda c: LAX[op](c, "i")) for op in LAX]
    pairs += [(lambda c: jaxring.reduce_scatter(c, "i"), lambda c: jax.lax.psum_scatter(c, "i")),
              (lambda c: jaxring.all_gather(c, "i"), lambda c: jax.lax.all_gather(c, "i"))]
    x = np.ones((2, 3), np.float32)
    for mine, lax in pairs:
        outcomes = [outcome(lambda: jax.pmap(lambda v: (v, f(const)), axis_name="i", devices=jax.devices()[:2])(x))
                    for f in (mine, lax)]
        assert outcomes[0] == outcomes[1]


# Narrower than any type the handlers take: each crosses the ring in a wider type that holds its values
# (arguments.py's wider_type) and lands back in its own.
NARROW = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float4_e2m1fn", "int4", "uint4")


@pytest.mark.parametrize("dtype", NARROW)
def test_every_op_of_the_narrow_types_is_lax_s_or_the_exact_sum_rounded_once(dtype):
    """Integers (sums wrapped), max and min bit for bit as lax's, all_gather the rows' bits; float
    sums are the exact sum rounded once to the type (float32 holds a sum of 5 of them exactly; lax's
    own may round at every step), and the mean that sum divided in the type, as lax.pmean divides."""
    ranks, rng, integer = 5, np.random.default_rng([5, NARROW.index(dtype)]), jnp.issubdtype(dtype, jnp.integer)
    if integer:
        info = jnp.iinfo(jnp.dtype(dtype))
        xs = tuple(rng.integers(int(info.min), int(info.max), (ranks, ranks * n), endpoint=True).astype(dtype)
                   for n in SIZES)
        sum_xs = xs
    else:  # float4_e2m1fn holds at most 6 (no inf, no NaN): its values stay within 1, their sums within 5
        scale = 1 if dtype == "float4_e2m1fn" else 3
        xs = tuple(np.clip(rng.standard_normal((ranks, ranks * n)) * scale, -5 * scale, 5 * scale) for n in SIZES)
        xs = tuple(np.clip(x, -1, 1) if dtype == "float4_e2m1fn" else x for x in xs)
        xs = tuple(x.astype(dtype) for x in xs)
        if dtype != "float4_e2m1fn":
            xs = tuple(np.where(rng.random(x.shape) < 0.1, np.asarray(np.nan, x.dtype), x) for x in xs)
        sum_xs = tuple(finite(x) for x in xs)
    mine = jax.tree.map(np.asarray, ops(JAXRING_OPS, ranks)(xs, sum_xs))
    lax = jax.tree.map(np.asarray, ops(LAX_OPS, ranks)(xs, sum_xs))
    for x, s, mine_ops, lax_ops in zip(xs, sum_xs, mine, lax):
        assert [a.dtype for a in mine_ops] == [b.dtype for b in lax_ops]
        total, mean, *ordered, scattered, gathered = mine_ops
        if integer:
            for a, b in zip(mine_ops, lax_ops):
                assert same_bits(a, b), dtype
            continue
        exact = s.astype(np.float64).sum(0).astype(dtype)
        assert same_bits(total, np.broadcast_to(exact, total.shape))
        assert same_bits(scattered.reshape(-1), exact)
        assert same_bits(mean, np.asarray(jnp.asarray(total) / ranks))
        for a, b in zip(ordered, lax_ops[2:4]):
            assert same_bits(a, b), f"{dtype} max or min differ from lax's"
        # every device gets every row, bits and all (lax's all_gather of float8_e5m2 may alter a NaN's payload)
        assert same_bits(gathered, np.broadcast_to(x[None], (ranks,) + x.shape))
