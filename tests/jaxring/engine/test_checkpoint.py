"""Checkpoints: round trip, keep last N plus best, atomic writes, shape checks."""

import numpy as np
import optax
import pytest

from jaxring.engine.checkpoint import Checkpoints


def make_state(seed):
    rng = np.random.default_rng(seed)
    params = {"dense": {"kernel": rng.normal(size=(3, 5)).astype(np.float32)}, "bias": rng.normal(size=(7,))}
    return {"params": params, "opt": optax.sgd(0.1, momentum=0.9).init(params), "step": np.int32(seed)}


def assert_equal_trees(a, b):
    import jax

    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(x, y)


def test_round_trip_with_extra(tmp_path):
    ckpt = Checkpoints(tmp_path)
    state = make_state(3)
    extra = {"batches": {"epoch": 2, "order": [3, 1, 2], "seed": 2**70}}
    ckpt.save(10, state, extra)
    restored, got = ckpt.restore(make_state(0))
    assert_equal_trees(restored, state)
    assert got == extra


def test_keeps_last_n_and_the_best(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=2, best_metric="wer")
    wers = {1: 0.9, 2: 0.5, 3: None, 4: 0.7, 5: 0.6, 6: None}
    for step, wer in wers.items():
        ckpt.save(step, make_state(step), {}, None if wer is None else {"wer": wer})
    assert ckpt.steps() == [2, 5, 6]
    assert ckpt.best() == {"step": 2, "metric": "wer", "value": 0.5}
    assert ckpt.latest() == 6
    assert_equal_trees(ckpt.restore(make_state(0), step=2)[0], make_state(2))


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt = Checkpoints(tmp_path)
    ckpt.save(1, make_state(1), {"at": 1})
    # what a run killed mid-write leaves: a partial temporary file
    (tmp_path / "step_000000002.msgpack.tmp").write_bytes(b"\x85partial")
    reopened = Checkpoints(tmp_path)
    assert reopened.steps() == [1]
    reopened.discard_partial()
    assert not list(tmp_path.glob("*.tmp"))
    assert reopened.restore(make_state(0))[1] == {"at": 1}


def test_clear_errors(tmp_path):
    ckpt = Checkpoints(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore(make_state(0))
    ckpt.save(1, make_state(1), {})
    with pytest.raises(FileNotFoundError, match=r"step 7 .*have \[1\]"):
        ckpt.restore(make_state(0), step=7)
    wrong = make_state(0)
    wrong["params"]["bias"] = np.zeros(8)
    with pytest.raises(ValueError, match=r"\['params'\]\['bias'\] is float64\[7\] but float64\[8\] is expected"):
        ckpt.restore(wrong)


def test_clear(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=5)
    for step in (1, 2):
        ckpt.save(step, make_state(step), {}, {"wer": 0.5})
    assert ckpt.clear() == 2 and ckpt.steps() == [] and ckpt.best() is None
    assert Checkpoints(tmp_path / "never_written").clear() == 0
