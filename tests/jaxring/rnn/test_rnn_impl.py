"""model.rnn_impl: the persistent layer (on CPU, the host mirror) inside Deep Speech 2 against the scan."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.rnn import layer
from models.deepspeech2.model import DeepSpeech2, ModelConfig, init_variables


def tiny(**overrides) -> ModelConfig:
    fields = dict(conv_layers=1, conv_channels=(3,), rnn_layers=1, rnn_hidden=7)
    return ModelConfig(**{**fields, **overrides})


def loss_and_gradients(config, variables, features, lengths, weights):
    def loss(params):
        logits, _ = DeepSpeech2(config).apply({**variables, "params": params}, features, lengths, train=True,
                                              mutable=("batch_stats",))[0]
        return jnp.sum(logits * weights)

    return jax.jit(jax.value_and_grad(loss))(variables["params"])


@pytest.mark.parametrize("cell, bidirectional", [("gru", True), ("rnn", False)])
def test_persistent_model_equals_the_scan_in_value_and_gradients(cell, bidirectional):
    rng = np.random.default_rng(5)
    scan = tiny(rnn_cell=cell, bidirectional=bidirectional, lookahead=2)
    persistent = tiny(rnn_cell=cell, bidirectional=bidirectional, lookahead=2, rnn_impl="persistent")
    variables = init_variables(scan, jax.random.key(1))
    lengths = jnp.asarray([19, 7, 12], jnp.int32)
    features = jnp.asarray(rng.normal(size=(3, 19, 161)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(3, 10, 29)), jnp.float32)
    want_loss, want = loss_and_gradients(scan, variables, features, lengths, weights)
    got_loss, got = loss_and_gradients(persistent, variables, features, lengths, weights)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert np.abs(w).max() > 0, path
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * np.abs(w).max(), err_msg=str(path))


def test_auto_keeps_the_scan_on_cpu_and_says_why():
    kernels, projected = jnp.zeros((2, 7, 21)), jnp.zeros((2, 3, 5, 21))
    assert layer.choose("scan", "gru", kernels, projected) == (False, None)
    assert layer.choose("persistent", "gru", kernels, projected) == (True, None)
    persistent, reason = layer.choose("auto", "gru", kernels, projected)
    assert not persistent and "scan on cpu" in reason


def test_a_layer_that_does_not_fit_falls_back_to_the_scan_with_a_log_line(caplog):
    kernels, projected = jnp.zeros((2, 4096, 3 * 4096)), jnp.zeros((2, 256, 2, 3 * 4096))
    persistent, reason = layer.choose("persistent", "gru", kernels, projected)
    assert not persistent and "does not fit" in reason and "4096" in reason
    config = tiny(rnn_impl="auto", rnn_layers=1)
    with caplog.at_level(logging.INFO, logger="models.deepspeech2.model"):
        init_variables(config, jax.random.key(0), frames=9)
    assert any("rnn_impl=auto" in r.message for r in caplog.records)


def test_unknown_implementation_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"model.rnn_impl must be one of \('scan', 'persistent', 'auto'\)"):
        tiny(rnn_impl="cudnn")
