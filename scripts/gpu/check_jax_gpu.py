"""jaxring through JAX on the GPUs of this machine (scripts/gpu/gpu_check.sh).

pmap, shard_map, grad, vmap, tree_allreduce and an SGD step with the ring,
each against jax.lax on the same devices. Run once per engine:

    JAXRING_CUDA_ENGINE=device python scripts/gpu/check_jax_gpu.py

With one GPU every ring has one rank: this checks the plumbing (lowering,
registration, buffers, engine selection), not the ring itself, which
scripts/gpu/check_cuda_ring.py checks with virtual ranks.
"""

import argparse
import functools
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

import jaxring

AXIS = "gpus"


def check_pmap(devices, rng):
    x = jnp.asarray(rng.standard_normal((len(devices), 1000003)), jnp.float32)
    ring = jax.pmap(lambda v: jaxring.allreduce(v, AXIS), AXIS, devices=devices)(x)
    psum = jax.pmap(lambda v: jax.lax.psum(v, AXIS), AXIS, devices=devices)(x)
    np.testing.assert_allclose(np.asarray(ring), np.asarray(psum), rtol=1e-5, atol=1e-5)
    for dtype in (jnp.bfloat16, jnp.float16, jnp.int32):
        y = x.astype(dtype) if dtype != jnp.int32 else jnp.asarray(rng.integers(-99, 99, x.shape), jnp.int32)
        out = jax.pmap(lambda v: jaxring.allreduce(v, AXIS), AXIS, devices=devices)(y)
        expected = np.asarray(y, np.float64).sum(0)
        tolerance = 0 if dtype == jnp.int32 else 2e-2 * len(devices)
        np.testing.assert_allclose(np.asarray(out[0], np.float64), expected, rtol=tolerance, atol=tolerance)


def check_shard_map(devices, rng):
    n = len(devices)
    mesh = Mesh(np.array(devices), (AXIS,))
    x = jnp.asarray(rng.standard_normal((n * n * 7, 5)), jnp.float32)

    def both(scatter, gather):
        @jax.jit
        @functools.partial(jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
        def run(v):
            return gather(scatter(v, AXIS, scatter_dimension=0, tiled=True), AXIS, axis=0, tiled=True)

        return np.asarray(run(x))

    expected = both(jax.lax.psum_scatter, jax.lax.all_gather)
    np.testing.assert_allclose(both(jaxring.reduce_scatter, jaxring.all_gather), expected, rtol=1e-5, atol=1e-5)


def check_grad_and_vmap(devices, rng):
    x = jnp.asarray(rng.standard_normal((len(devices), 64)), jnp.float32)

    def loss(v, allreduce):
        return jnp.sum(allreduce(v, AXIS) ** 2)

    def grads(allreduce):
        return jax.pmap(jax.grad(lambda v: loss(v, allreduce)), AXIS, devices=devices)(x)

    np.testing.assert_allclose(np.asarray(grads(jaxring.allreduce)), np.asarray(grads(jax.lax.psum)), rtol=1e-5)
    batched = jnp.stack([x, 2 * x], axis=1)
    out = jax.pmap(jax.vmap(lambda v: jaxring.allreduce(v, AXIS)), AXIS, devices=devices)(batched)
    np.testing.assert_allclose(np.asarray(out[0, 1]), 2 * np.asarray(x).sum(0), rtol=1e-5, atol=1e-5)


def tree(rng, n):
    return {
        "w": jnp.asarray(rng.standard_normal((n, 300, 70)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal((n, 70)), jnp.float32),
        "h": jnp.asarray(rng.standard_normal((n, 1001)), jnp.bfloat16),
    }


def check_tree_allreduce(devices, rng):
    grads = tree(rng, len(devices))
    ring = jax.pmap(lambda t: jaxring.tree_allreduce(t, AXIS, "mean", bucket_bytes=64 << 10), AXIS, devices=devices)(grads)
    pmean = jax.pmap(lambda t: jax.lax.pmean(t, AXIS), AXIS, devices=devices)(grads)
    for name in grads:
        np.testing.assert_allclose(np.asarray(ring[name], np.float64), np.asarray(pmean[name], np.float64),
                                   rtol=1e-2, atol=1e-2)


def check_sgd_step(devices, rng):
    """A data-parallel step as the trainer takes it: grad, fused mean of the gradients, optax update."""
    n = len(devices)
    params = {"w": jnp.asarray(rng.standard_normal((13, 7)), jnp.float32), "b": jnp.zeros((7,), jnp.float32)}
    x = jnp.asarray(rng.standard_normal((n, 16, 13)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((n, 16, 7)), jnp.float32)
    optimizer = optax.sgd(0.1, momentum=0.9)

    def step(mean, p, state, xb, yb):
        g = jax.grad(lambda q: jnp.mean((jnp.tanh(xb @ q["w"] + q["b"]) - yb) ** 2))(p)
        updates, state = optimizer.update(mean(g), state, p)
        return optax.apply_updates(p, updates), state

    def copies(t):
        return jax.tree.map(lambda a: jnp.stack([a] * n), t)

    replicated, state = copies(params), copies(optimizer.init(params))
    ring = jax.pmap(functools.partial(step, lambda g: jaxring.tree_allreduce(g, AXIS, "mean")), AXIS, devices=devices)
    lax = jax.pmap(functools.partial(step, lambda g: jax.lax.pmean(g, AXIS)), AXIS, devices=devices)
    p_ring, _ = ring(replicated, state, x, y)
    p_lax, _ = lax(replicated, state, x, y)
    for name in params:
        np.testing.assert_allclose(np.asarray(p_ring[name]), np.asarray(p_lax[name]), rtol=1e-5, atol=1e-6)
        assert all(np.asarray(p_ring[name][i]).tobytes() == np.asarray(p_ring[name][0]).tobytes() for i in range(n))


CHECKS = [check_pmap, check_shard_map, check_grad_and_vmap, check_tree_allreduce, check_sgd_step]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", default="gpu", help="'cpu' runs the same checks on host devices")
    devices = jax.devices(parser.parse_args().platform)
    print(f"{len(devices)} device(s): {devices}", flush=True)
    rng = np.random.default_rng(0)
    failed = []
    for check in CHECKS:
        try:
            check(devices, rng)
            print("ok  ", check.__name__, flush=True)
        except Exception:  # noqa: BLE001  every check runs; the exit status says whether any failed
            traceback.print_exc()
            print("FAIL", check.__name__, flush=True)
            failed.append(check.__name__)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
