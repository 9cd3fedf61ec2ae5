"""examples/library_training.py: the classifier trained with jaxring's all-reduce alone, under pmap, under
shard_map (with pcast), and over every device of two processes (jax.distributed under mpirun)."""

import json

import pytest

from tests.docs.markdown import command
from tests.tiny_runs import ROOT, finish, mpirun

GUIDE = "docs/YOUR_MODEL.md"
STEPS = 60  # of the script's 150: enough to learn, and the suite stays quick


@pytest.fixture(scope="module")
def library_training():
    import sys

    sys.path.insert(0, str(ROOT / "examples"))  # as running the script puts its folder first
    import library_training

    return library_training


@pytest.fixture(scope="module")
def pmap_result(library_training):
    return library_training.main(["pmap", "--steps", str(STEPS)])


def learned(result):
    """Chance is 75% errors on 4 classes; the clusters allow about 4% (6% after 60 steps)."""
    return result["dev_error_rate"] < 0.1 and result["last_loss"] < result["first_loss"] / 4


def test_pmap_learns_and_the_ring_matches_lax(pmap_result):
    assert pmap_result["devices"] == 8 and learned(pmap_result), pmap_result
    assert pmap_result["ring_vs_lax_max_difference"] < 1e-6  # the float32 mean of the same gradients


def test_shard_map_with_pcast_learns_as_pmap_does(library_training, pmap_result):
    result = library_training.main(["shard_map", "--steps", str(STEPS)])
    assert learned(result) and result["ring_vs_lax_max_difference"] < 1e-6, result
    assert result["last_loss"] == pytest.approx(pmap_result["last_loss"], rel=1e-4)  # the same training
    assert result["dev_error_rate"] == pytest.approx(pmap_result["dev_error_rate"], abs=0.01)


def test_the_pcast_the_example_explains_is_what_keeps_the_gradient_a_mean(library_training):
    """Without pcast, the gradient of a replicated parameter is already summed by JAX: the 'mean' is N times it."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxring

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    x = np.random.default_rng(3).standard_normal((5 * jax.device_count(), 3)).astype(np.float32)
    w = np.array([0.5, -1.0, 2.0], np.float32)

    def mean_gradient(cast):
        @jax.jit
        @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P())
        def gradient(w, rows):
            w = jax.lax.pcast(w, "batch", to="varying") if cast else w
            return jaxring.allreduce(jax.grad(lambda v: jnp.mean((rows @ v) ** 2))(w), "batch", op="mean")

        return np.asarray(gradient(w, jax.device_put(x, NamedSharding(mesh, P("batch")))), np.float64)

    reference = 2 * x.T.astype(np.float64) @ (x.astype(np.float64) @ w) / len(x)
    np.testing.assert_allclose(mean_gradient(cast=True), reference, rtol=1e-5)
    np.testing.assert_allclose(mean_gradient(cast=False), jax.device_count() * reference, rtol=1e-5)


def test_two_processes_train_as_one_process_with_as_many_devices(library_training):
    """The guide's mpirun line (2 processes x 4 devices) against this process's 8 devices."""
    words = command(GUIDE, "mpirun -np 2 python examples/library_training.py")
    code, output = finish(mpirun(2, [ROOT / words[4], *words[5:], "--steps", "40"], devices_per_proc=4),
                          timeout_s=200)
    assert code == 0, output
    results = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert len(results) == 2 and results[0] == results[1], output  # every process holds the same model
    two = results[0]
    one = library_training.main(["shard_map", "--steps", "40"])
    assert (two["processes"], two["devices"], one["devices"]) == (2, 8, 8)
    assert two["ring_vs_lax_max_difference"] < 1e-6 and two["last_loss"] < two["first_loss"] / 2
    assert two["last_loss"] == pytest.approx(one["last_loss"], rel=1e-4)
