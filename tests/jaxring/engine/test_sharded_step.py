"""train.shard_optimizer (jaxring/engine/sharded_step.py): the replicated step's training, each device holding
its blocks of the optimizer state; checkpoints in the replicated layout, so a run resumes across the setting."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.engine import trainer as trainer_lib
from jaxring.engine.checkpoint import Checkpoints
from tests.jaxring.engine.toy_task import (FLOAT16_CONFIG, SHARDED_CONFIG, WIRE_STEPS, LoudTask, ToyTask, toy_config,
                                          with_train, world_of)
from tests.jaxring.engine.test_resume_shapes import RESUMED_AT, rows, stopped_at
from tests.tiny_runs import finish, mpirun

STEPS = 12
WORKER = Path(__file__).with_name("sharded_worker.py")


class BiasedTask(ToyTask):
    """ToyTask with an output bias: a 1-D leaf, which optim.weight_decay_mask matrices leaves undecayed."""

    def init(self, rng):
        variables = super().init(rng)
        variables["params"]["b"] = jnp.full((1,), 0.7)
        return variables

    def _forward(self, params, x):
        return super()._forward(params, x) + params["b"]


def queued_run(task, config, devices):
    """The losses, gradient norms and final state (on the devices) of STEPS queued steps of the Trainer's step."""
    trainer = trainer_lib.Trainer(task, config, "unused", world_of(devices))
    state = trainer.on_devices(trainer.init_state())
    losses, norms = [], []
    for _, batch in zip(range(STEPS), trainer.batches):
        state, metrics = trainer.train_step(state, batch)
        losses.append(metrics["loss"])
        norms.append(metrics["grad_norm"])
    return np.asarray(losses), np.asarray(norms), state, trainer


def assert_same_bits_on_every_device(state):
    for leaf in jax.tree_util.tree_leaves((state.params, state.loss_scale)):
        leaf = np.asarray(leaf)
        assert (leaf == leaf[:1]).all()


# Each case against the replicated step on the same seeds (adamw, clipping and warmup_cosine: the mpirun
# run below), on 8, 2 and 4 devices; toy_config clips at norm 1, which these runs' norms cross both ways.
# Clipping divides by a norm summed in another order (blocks, not leaves), and
# adamw's arithmetic runs on flat blocks, where XLA's vectorised loops may contract a multiply-add
# differently: a few float32 ulps a step.
CASES = {
    # 6 steps an epoch: anneal halves the rate after the sixth.
    "sgd-nesterov-anneal-accumulated-8": ({"name": "sgd", "momentum": 0.9, "nesterov": True, "clip_norm": None,
                                           "schedule": "anneal", "anneal_factor": 2.0},
                                          {"accumulate_steps": 2, "batch_size": 16, "epochs": 2}, 8),
    "sgd-momentum-clipped-2": ({"name": "sgd", "momentum": 0.9}, {}, 2),
    "adamw-decay-mask-4": ({"name": "adamw", "learning_rate": 0.01, "weight_decay": 0.5,
                            "weight_decay_mask": "matrices"}, {}, 4),
}


@pytest.mark.parametrize("case", CASES)
def test_the_sharded_step_trains_as_the_replicated_one(case):
    optim, train, devices = CASES[case]
    runs = {}
    for shard in (False, True):
        config = toy_config(train={"max_steps": STEPS, "shard_optimizer": shard, "bucket_bytes": 64, **train},
                            optim=optim)
        runs[shard] = queued_run(BiasedTask(), config, devices)
    (losses, norms, replicated, trainer), (sharded_losses, sharded_norms, sharded, sharded_trainer) = runs.values()
    assert len(set(losses[:, 0].tolist())) == STEPS
    np.testing.assert_allclose(sharded_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(sharded_norms, norms, rtol=1e-5)
    assert_same_bits_on_every_device(sharded)
    # Each device holds its own blocks: 1/devices of the state (rounded up), not a copy.
    moments = [x for x in jax.tree_util.tree_leaves(sharded.opt_state) if np.ndim(x) > 1]
    assert moments and all(not np.array_equal(np.asarray(x)[0], np.asarray(x)[1]) for x in moments)
    whole = trainer.on_host(replicated)
    gathered = sharded_trainer.on_host(sharded)
    assert jax.tree_util.tree_structure(whole) == jax.tree_util.tree_structure(gathered)
    for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(gathered)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-6)


@pytest.fixture(scope="module")
def float16_replicated():
    """FLOAT16_CONFIG's replicated run on 4 devices of one process: what its sharded runs skip and train to."""
    return queued_run(LoudTask(), toy_config(**FLOAT16_CONFIG), 4)


def test_float16_skips_the_same_overflowed_steps(float16_replicated):
    """Loss scaling: a step whose gradients overflowed on any device's block is skipped on every device
    (with lax's reduce-scatter and all-gather: train.allreduce psum)."""
    config = toy_config(**with_train(FLOAT16_CONFIG, shard_optimizer=True))
    _, _, sharded, _ = queued_run(LoudTask(), config, 4)
    _, _, replicated, _ = float16_replicated
    scale = float(np.asarray(replicated.loss_scale.scale)[0])
    assert scale < 2.0**15  # some steps overflowed and were skipped
    np.testing.assert_array_equal(np.asarray(sharded.loss_scale.scale), np.asarray(replicated.loss_scale.scale))
    assert_same_bits_on_every_device(sharded)
    for a, b in zip(jax.tree_util.tree_leaves(replicated.params), jax.tree_util.tree_leaves(sharded.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)


def test_an_optimizer_that_is_not_elementwise_is_refused_at_start_up(monkeypatch):
    from jaxring.engine import optim

    monkeypatch.setitem(optim.OPTIMIZERS, "lamb", lambda cfg, schedule: None)  # a layer-wise trust ratio
    config = toy_config(train={"shard_optimizer": True}, optim={"name": "lamb"})
    with pytest.raises(ValueError, match="train.shard_optimizer applies optim.name 'lamb'.*sgd, adamw"):
        trainer_lib.Trainer(ToyTask(), config, "unused", world_of(2))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """SHARDED_CONFIG's run replicated on 1 x 4, and sharded on 2 processes x 2 local devices: straight, and
    resumed from the replicated run's checkpoint of step RESUMED_AT (sharded_worker.py)."""
    directory = tmp_path_factory.mktemp("sharded")
    trainer_lib.Trainer(ToyTask(), toy_config(**SHARDED_CONFIG), directory / "one", world_of(4)).fit()
    stopped_at(directory / "one", directory / "resumed")
    code, output = finish(mpirun(2, [WORKER, directory / "mpi"], with_mpi4py=True, devices_per_proc=2), 300)
    assert code == 0, output
    assert "2 local cpu devices x 2 processes" in output
    assert f"resuming step {RESUMED_AT} on 2 x 2 cpu (processes x local devices; trained on 1 x 4 cpu)" in output
    return directory


def final_state(workdir: Path):
    template = trainer_lib.Trainer(ToyTask(), toy_config(**SHARDED_CONFIG), workdir / "t", world_of(1)).init_state()
    state, _ = Checkpoints(workdir / "checkpoints").restore(template)
    assert int(state.step) == 24 and not np.array_equal(state.params["w1"], template.params["w1"])
    return state


def assert_close(a, b):
    """The same training: another summation order of the replicas (and of the norm's blocks) apart."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(y, x, rtol=2e-5, atol=1e-6)


def test_under_mpirun_2x2_it_trains_as_one_process_of_4_replicated(runs):
    """Each of the 4 devices holds its own block, across processes too (the leg's reduce-scatter and all-gather
    phases); the processes' weights are checked alike at every checkpoint (Trainer.save's check_replicas)."""
    assert_close(final_state(runs / "one"), final_state(runs / "mpi"))


def test_under_mpirun_2x2_the_library_update_holds_a_quarter_of_the_state(runs):
    """sharded_worker.library_steps: with bfloat16 across processes, sgd's weights are the replicated ones bit
    for bit (each sum is of two terms, one rounding apart in either order); adamw's within float tolerance
    (its arithmetic on flat blocks may contract a multiply-add differently: a few ulps a step)."""
    ranks = [dict(np.load(runs / f"library_rank{rank}.npz")) for rank in (0, 1)]
    for leaves in ranks:
        for key in ("w", "b", "v"):
            ours = leaves[f"sgd_ours_{key}"]
            np.testing.assert_array_equal(ours, leaves[f"sgd_theirs_{key}"])
            np.testing.assert_array_equal(ours, ranks[0][f"sgd_ours_{key}"])  # every device of every process
            ours = leaves[f"adamw_ours_{key}"]
            assert (ours == ranks[0][f"adamw_ours_{key}"][:1]).all()
            np.testing.assert_allclose(ours, leaves[f"adamw_theirs_{key}"], rtol=2e-5, atol=1e-6)
        # 91, 5 and 360 floats in buckets of their own, each split over 2 x 2 devices.
        assert sorted(leaves["adamw_block_sizes"].tolist()) == [2, 23, 90]


def test_under_mpirun_2x2_gradients_crossing_in_bfloat16_train_as_replicated(runs):
    """train.allreduce_dtype bfloat16 in an engine run (sharded_worker.wire_steps): the leg's reduce-scatter phase
    rounds the gradients where the replicated all-reduce's leg does, so the runs stay within float tolerance; the
    float32 run's weights at that step (its checkpoint) are not, so the setting took effect on both paths."""
    wire = {name: dict(np.load(runs / f"wire_{name}.npz")) for name in ("replicated", "sharded")}
    template = trainer_lib.Trainer(ToyTask(), toy_config(**SHARDED_CONFIG), runs / "t", world_of(1)).init_state()
    float32, _ = Checkpoints(runs / "mpi" / "checkpoints").restore(template, WIRE_STEPS)
    for key, replicated in wire["replicated"].items():
        np.testing.assert_allclose(wire["sharded"][key], replicated, rtol=2e-5, atol=1e-6)
        for run in wire.values():
            assert not np.allclose(run[key], float32.params[key], rtol=2e-5, atol=1e-6), key


def test_under_mpirun_2x2_a_sharded_run_resumes_a_replicated_run_of_1x4(runs):
    """The 1 x 4 replicated run's checkpoint of step 10 goes on sharded over 2 processes x 2 devices, its whole
    optimizer state split into 4 blocks across the processes: the training of the run that did not stop, row by
    row (every device of every process holds the same weights at each checkpoint: Trainer.save's check_replicas)."""
    assert_close(final_state(runs / "one"), final_state(runs / "resumed"))
    before, after = rows(runs / "one"), rows(runs / "resumed")
    assert sorted(after) == sorted(before)  # every row once, none lost at the resume
    for step in [step for step in before if step > RESUMED_AT and "learning_rate" in before[step]]:
        assert after[step]["learning_rate"] == before[step]["learning_rate"], step
        assert after[step]["loss"] == pytest.approx(before[step]["loss"], rel=1e-4), step


def test_under_mpirun_2x2_float16_skips_the_same_steps_on_every_device(runs, float16_replicated):
    """Loss scaling sharded over 2 processes x 2 devices (sharded_worker.float16_steps): a step whose gradients
    overflowed on any device is skipped on every device of every process (one count over every block, across the
    processes too), the steps the replicated run skips, with its loss scale and weights."""
    _, norms, replicated, _ = float16_replicated
    skipped = ~np.isfinite(norms[:, 0])  # a skipped step's gradients, and so their norm, are not finite
    assert skipped.any() and not skipped.all()
    ranks = [dict(np.load(runs / f"float16_rank{rank}.npz")) for rank in (0, 1)]
    for leaves in ranks:
        np.testing.assert_array_equal(~np.isfinite(leaves["norms"]), np.stack([skipped, skipped], axis=1))
        for key in ("scale", "good_steps", "w1", "w2"):
            assert (leaves[key] == ranks[0][key][:1]).all(), key  # the same bits on every device of every process
        np.testing.assert_array_equal(leaves["scale"][0], np.asarray(replicated.loss_scale.scale)[0])
        np.testing.assert_array_equal(leaves["good_steps"][0], np.asarray(replicated.loss_scale.good_steps)[0])
        for key in ("w1", "w2"):
            np.testing.assert_allclose(leaves[key][0], np.asarray(replicated.params[key])[0], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("shard", [False, True])
def test_a_sharded_run_resumes_on_another_shape(runs, tmp_path, shard):
    """Checkpoints hold the replicated layout: the 2 x 2 sharded run's step 10 goes on in one process of
    2 devices, replicated or sharded (its state in 2 blocks, not 4)."""
    resumed = stopped_at(runs / "mpi", tmp_path / "run")
    config = toy_config(**with_train(SHARDED_CONFIG, shard_optimizer=shard))
    trainer_lib.Trainer(ToyTask(), config, resumed, world_of(2)).fit(resume=True)
    assert_close(final_state(runs / "one"), final_state(resumed))
