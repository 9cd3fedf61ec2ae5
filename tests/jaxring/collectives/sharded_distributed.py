"""jaxring.ShardedUpdate under jax.distributed, run by mpi_workers/distributed.py: in one's own jit(shard_map) loop
(check_vma on) over a mesh axis that spans every process, each of the S devices holds 1/S of adamw's state and
the weights are those of optax's whole update of the mean gradients; processes= there is refused while tracing."""

import functools
import time

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxring

SHAPES = {"w": (13, 7), "b": (7,), "v": (40, 9)}  # 458 floats in one bucket: padded over 4 or 6 devices
CLIP = 30.0


def _grads(process, step, local_devices):
    """Process `process`'s gradients at `step`, one row per local device: random, scaled to both sides of CLIP."""
    rng = np.random.default_rng([5, process, step])
    scale = (1.0, 9.0, 0.4, 3.0)[step]
    return {k: (rng.standard_normal((local_devices, *s)) * scale).astype(np.float32) for k, s in SHAPES.items()}


def check(mesh, comm):
    """Four queued steps against adamw in float64 numpy, the same bits on every device; processes= refused."""
    rank, size, local = comm.Get_rank(), comm.Get_size(), jax.local_device_count()
    matrices = lambda params: jax.tree.map(lambda x: x.ndim == 2, params)  # noqa: E731
    optimizer = optax.adamw(optax.linear_schedule(0.05, 0.01, 4), weight_decay=0.5)
    sharded = jaxring.ShardedUpdate(optimizer, "x", clip_norm=CLIP, decay_mask=matrices)
    start = {k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    whole, blocks = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))

    def init_of(update):
        return jax.jit(jax.shard_map(lambda p: jax.tree.map(lambda x: x[None], update.init(p)), mesh=mesh,
                                     in_specs=P(), out_specs=P("x")))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("x"), P("x")), out_specs=(P(), P("x"), P()))
    def step(p, s, g):
        update = sharded.update(jax.tree.map(lambda x: x[0], g), jax.tree.map(lambda x: x[0], s), p)
        return update.params, jax.tree.map(lambda x: x[None], update.opt_state), update.grad_norm

    ours = jax.tree.map(lambda a: jax.make_array_from_process_local_data(whole, a), start)
    state = init_of(sharded)(ours)
    theirs = Adamw(start, matrices(start))
    for k in range(4):
        grads = jax.tree.map(lambda a: jax.make_array_from_process_local_data(blocks, a), _grads(rank, k, local))
        ours, state, norm = step(ours, state, grads)
        every = [_grads(p, k, local) for p in range(size)]
        mean = {key: np.concatenate([g[key] for g in every]).astype(np.float64).mean(0) for key in SHAPES}
        their_norm = theirs.step(mean, 0.05 - 0.01 * k)  # the linear schedule's rate at step k
        np.testing.assert_allclose(float(norm.addressable_shards[0].data), their_norm, rtol=1e-5)
    for key in SHAPES:
        shards = [np.asarray(shard.data) for shard in ours[key].addressable_shards]
        assert len({shard.tobytes() for shard in shards}) == 1, key  # this process' devices
        assert len(set(comm.allgather(shards[0].tobytes()))) == 1, key  # and every process'
        # float32's roundings of adam's normalised step, a few a step.
        np.testing.assert_allclose(shards[0], theirs.params[key], rtol=1e-5, atol=1e-6, err_msg=key)
    moments = jax.tree.leaves(state[0].mu)  # adamw's first moment: one block of the bucket per device
    assert moments[0].shape == (size * local, -(-sum(np.prod(s) for s in SHAPES.values()) // (size * local)))

    twice = jaxring.ShardedUpdate(optimizer, "x", processes=True)
    began = time.monotonic()
    try:
        init_of(twice)(ours)
        raise AssertionError("ShardedUpdate(processes=True) over an axis spanning processes was not refused")
    except ValueError as error:
        assert "ShardedUpdate('x', processes=...)" in str(error) and "Drop processes=" in str(error), error
    assert time.monotonic() - began < 60


class Adamw:
    """optax.clip_by_global_norm(CLIP) then optax.adamw(weight_decay=0.5, mask=...) in float64 numpy."""

    def __init__(self, params, decays, b1=0.9, b2=0.999, eps=1e-8):
        self.params = {k: v.astype(np.float64) for k, v in params.items()}
        self.decays, self.b1, self.b2, self.eps, self.count = decays, b1, b2, eps, 0
        self.mu = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.nu = {k: np.zeros_like(v) for k, v in self.params.items()}

    def step(self, grads, rate) -> float:
        """One update by the mean gradients `grads` at learning rate `rate`; their global norm, before clipping."""
        norm = float(np.sqrt(sum(np.sum(g**2) for g in grads.values())))
        self.count += 1
        for k, g in grads.items():
            g = g if norm < CLIP else g / norm * CLIP
            self.mu[k] = self.b1 * self.mu[k] + (1 - self.b1) * g
            self.nu[k] = self.b2 * self.nu[k] + (1 - self.b2) * g**2
            mu, nu = self.mu[k] / (1 - self.b1**self.count), self.nu[k] / (1 - self.b2**self.count)
            update = mu / (np.sqrt(nu) + self.eps) + (0.5 * self.params[k] if self.decays[k] else 0)
            self.params[k] = self.params[k] - float(rate) * update
        return norm
