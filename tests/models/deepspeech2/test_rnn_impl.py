"""model.rnn_impl: the persistent layer inside Deep Speech 2 against the scan, the host mirror in place of its
kernels (tests/jaxring/rnn/mirrored_layer.py); on a CPU, the scan with one warning."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.deepspeech2 import model as model_lib
from models.deepspeech2.model import DeepSpeech2, ModelConfig, init_variables
from tests.jaxring.rnn.mirrored_layer import stand_in_for_the_kernels

ROOT = Path(__file__).resolve().parents[3]


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
def test_persistent_model_equals_the_scan_in_value_and_gradients(monkeypatch, cell, bidirectional):
    stand_in_for_the_kernels(monkeypatch.setattr)
    rng = np.random.default_rng(5)
    scan = tiny(rnn_cell=cell, bidirectional=bidirectional, lookahead=2)
    persistent = tiny(rnn_cell=cell, bidirectional=bidirectional, lookahead=2, rnn_impl="persistent")
    variables = init_variables(scan, jax.random.key(1))
    lengths = jnp.asarray([19, 7, 12], jnp.int32)
    features = jnp.asarray(rng.normal(size=(3, 19, 161)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(3, 10, 29)), jnp.float32)
    want_loss, want = loss_and_gradients(scan, variables, features, lengths, weights)
    got_loss, got = loss_and_gradients(persistent, variables, features, lengths, weights)
    forward = jax.jit(lambda params: DeepSpeech2(persistent).apply(
        {**variables, "params": params}, features, lengths, train=True, mutable=("batch_stats",)))
    assert "callback" in forward.lower(variables["params"]).as_text()  # the mirror ran, not the scan
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert np.abs(w).max() > 0, path
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * np.abs(w).max(), err_msg=str(path))

def test_persistent_on_a_cpu_runs_the_scan_with_one_warning(caplog):
    model_lib._log_once.cache_clear()  # an earlier test may have logged the line already
    config = tiny(rnn_impl="persistent", bidirectional=True)
    with caplog.at_level(logging.INFO, logger="models.deepspeech2.model"):
        for frames in (9, 13):  # traced again for each shape
            init_variables(config, jax.random.key(0), frames=frames)
    said = [(r.levelno, r.message) for r in caplog.records]
    assert said == [(logging.WARNING, "model.rnn_impl=persistent: the scan on cpu, the persistent layer's kernel "
                                      "runs on CUDA GPUs only")]


def test_a_layer_that_does_not_fit_is_logged_naming_the_setting(caplog):
    config = tiny(rnn_impl="auto", rnn_layers=1)
    with caplog.at_level(logging.INFO, logger="models.deepspeech2.model"):
        init_variables(config, jax.random.key(0), frames=9)
    assert any("rnn_impl=auto" in r.message for r in caplog.records)


def test_unknown_implementation_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"model.rnn_impl must be one of \('scan', 'persistent', 'auto'\)"):
        tiny(rnn_impl="cudnn")


def test_persistent_trains_like_the_scan_under_pmap_over_two_host_devices():
    # Its own process with exactly 2 devices and XLA's pool as jaxring sizes it: with NPROC=2 (XLA's
    # own size on 2 cores) the host mirror's callbacks held the pool's threads and
    # `bench_train.py --host-devices 2 --set model.rnn_impl=persistent` hung (docs/PERSISTENT_RNN.md).
    env = {k: v for k, v in os.environ.items() if k != "NPROC"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run([sys.executable, "-m", "tests.models.deepspeech2.persistent_under_pmap"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout)
    scan, persistent = runs["scan"], runs["persistent"]
    assert scan["devices"] == persistent["devices"] == 2
    np.testing.assert_allclose(persistent["losses"], scan["losses"], rtol=1e-4)
    assert len(set(scan["losses"])) == len(scan["losses"])  # each step its own values
    for path, want in scan["grads"].items():
        want, got = np.asarray(want), np.asarray(persistent["grads"][path])
        assert np.abs(want).max() > 0, path
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * np.abs(want).max(), err_msg=path)
