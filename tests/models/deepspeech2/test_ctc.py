"""CTC loss against a brute-force sum over all alignments, feasibility, gradients."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.deepspeech2 import ctc
from models.deepspeech2.ctc import frames_needed

ctc_loss = jax.jit(ctc.ctc_loss)


def brute_force_nll(logits, label, blank=0):
    """-log sum over every frame-level path that collapses to `label` (float64)."""
    log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    total = -np.inf
    for path in itertools.product(range(logits.shape[1]), repeat=logits.shape[0]):
        collapsed = [s for s, _ in itertools.groupby(path) if s != blank]
        if collapsed == list(label):
            total = np.logaddexp(total, log_probs[np.arange(len(path)), path].sum())
    return -total


def test_matches_brute_force_on_padded_batches():
    rng = np.random.default_rng(0)
    vocab = 4  # blank + 3 symbols keeps the enumeration small (4^6 paths)
    cases = [  # (frames, label): repeats, empty label, label as long as it can be
        (6, [1, 2]),
        (5, [3, 3]),
        (6, [1, 1, 2]),
        (4, []),
        (3, [2, 1, 3]),
        (1, [2]),
    ]
    max_frames, max_label = 7, 4  # every utterance padded
    logits = rng.standard_normal((len(cases), max_frames, vocab)) * 2
    labels = np.zeros((len(cases), max_label), np.int32)
    for i, (_, label) in enumerate(cases):
        labels[i, : len(label)] = label
    out_lengths = np.array([t for t, _ in cases], np.int32)
    label_lengths = np.array([len(label) for _, label in cases], np.int32)

    loss, feasible = ctc_loss(jnp.asarray(logits, jnp.float32), out_lengths, labels, label_lengths)

    assert np.asarray(feasible).all()
    expected = [brute_force_nll(logits[i, :t], label) for i, (t, label) in enumerate(cases)]
    np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-5)


def test_frames_needed_counts_blanks_between_repeats():
    labels = jnp.array([[1, 1, 2, 2, 0, 0], [3, 3, 3, 0, 0, 0], [1, 2, 3, 1, 1, 0], [4, 4, 0, 0, 0, 0]])
    label_lengths = jnp.array([4, 3, 5, 1])  # the last label's padding repeats a real symbol
    np.testing.assert_array_equal(frames_needed(labels, label_lengths), [6, 5, 6, 1])


def test_infeasible_utterances_are_masked_not_infinite():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((3, 4, 29)), jnp.float32)
    labels = jnp.array([[5, 5, 0], [1, 2, 3], [7, 8, 0]])
    label_lengths = jnp.array([2, 3, 2])
    out_lengths = jnp.array([2, 2, 4])  # "ee" needs 3 frames, "abc" needs 3
    loss, feasible = ctc_loss(logits, out_lengths, labels, label_lengths)
    np.testing.assert_array_equal(feasible, [False, False, True])
    np.testing.assert_array_equal(loss[:2], [0.0, 0.0])
    assert 0 < float(loss[2]) < 100

    def mean_loss(logits):
        loss, feasible = ctc_loss(logits, out_lengths, labels, label_lengths)
        return loss.sum() / feasible.sum()

    grad = jax.grad(mean_loss)(logits)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(grad[:2], 0.0)


@pytest.mark.parametrize("length", [0, 3])
def test_empty_or_short_batches_have_finite_loss(length):
    logits = jnp.zeros((1, 3, 29))
    loss, feasible = ctc_loss(logits, jnp.array([length]), jnp.zeros((1, 2), jnp.int32), jnp.array([0]))
    assert bool(feasible[0]) and np.isfinite(float(loss[0]))
