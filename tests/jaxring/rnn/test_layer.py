"""model.rnn_impl: the persistent layer (on CPU, the host mirror) inside Deep Speech 2 against the scan."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.rnn import layer
from jaxring.rnn.plan import A100
from models.deepspeech2.model import DeepSpeech2, ModelConfig, init_variables

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


# On CUDA (faked here: no GPU on the test machines), the choice by the device's own budget.
ds2_paper_layer = dict(kernels=jnp.zeros((2, 620, 3 * 620)), projected=jnp.zeros((2, 32, 5, 3 * 620)))


def on_cuda(monkeypatch, budget=layer.H100, module=object()):
    monkeypatch.setattr(layer, "platform", lambda: "cuda")
    monkeypatch.setattr(layer, "cuda_module", lambda: module)
    monkeypatch.setattr(layer, "cuda_budget", lambda: budget)


def test_auto_picks_the_kernel_on_cuda_where_the_layer_fits(monkeypatch):
    on_cuda(monkeypatch)
    assert layer.choose("auto", "gru", **ds2_paper_layer) == (True, None)
    assert layer.choose("persistent", "gru", **ds2_paper_layer) == (True, None)


def test_on_cuda_a_layer_too_large_for_the_device_falls_back_saying_why(monkeypatch):
    on_cuda(monkeypatch, budget=A100)  # hidden 2048: 38 units a block, 2048 x 114 float32 weights, over 163 KiB
    too_large = dict(kernels=jax.ShapeDtypeStruct((2, 2048, 3 * 2048), jnp.float32),
                     projected=jax.ShapeDtypeStruct((2, 32, 5, 3 * 2048), jnp.float32))
    for impl in ("auto", "persistent"):
        persistent, reason = layer.choose(impl, "gru", **too_large)
        assert not persistent and f"rnn_impl={impl}" in reason and "does not fit" in reason and "A100" in reason


def test_on_cuda_float64_falls_back_naming_the_kernels_dtypes(monkeypatch):
    on_cuda(monkeypatch)
    # choose reads shapes and dtypes only: numpy stands in for float64 arrays without enabling x64.
    persistent, reason = layer.choose("auto", "gru", np.zeros((2, 7, 21)), np.zeros((2, 3, 5, 21)))
    assert not persistent and "float32 or bfloat16, not float64" in reason


def test_on_cuda_without_the_compiled_handlers_persistent_is_refused_and_auto_falls_back(monkeypatch):
    on_cuda(monkeypatch, budget="jaxring was built without the persistent layer's CUDA handlers", module=None)
    with pytest.raises(RuntimeError, match=r"built without the persistent layer's CUDA handlers.*rebuild jaxring"):
        layer.choose("persistent", "gru", **ds2_paper_layer)
    persistent, reason = layer.choose("auto", "gru", **ds2_paper_layer)
    assert not persistent and "built without" in reason


def test_other_gpus_keep_the_scan(monkeypatch):
    monkeypatch.setattr(layer, "platform", lambda: "rocm")
    persistent, reason = layer.choose("persistent", "gru", **ds2_paper_layer)
    assert not persistent and "the scan on rocm" in reason and "CUDA" in reason


def custom_calls(text: str) -> dict[str, str]:
    """Target -> (its batch rows, its staged chunk, its unit groups, its signature `(operands) -> (results)`),
    from lowered StableHLO."""
    calls = re.findall(r"custom_call @(\w+)\(.*?\{batch_rows = (\d+) : i64, chunk = (\d+) : i64, .*?"
                       r"unit_groups = (\d+) : i64\}.*?\s*:\s*(\(.*\) -> \(.*\))", text)
    return {target: (int(rows), int(chunk), int(groups), signature) for target, rows, chunk, groups, signature in calls}


@pytest.mark.skipif(layer.cuda_module() is None, reason="jaxring was built without a CUDA toolkit")
@pytest.mark.parametrize("cell, dtype, directions", [("gru", "bf16", 2), ("rnn", "f32", 1)])
def test_on_cuda_the_gradient_lowers_to_the_handlers_with_the_buffers_they_check(monkeypatch, cell, dtype, directions):
    on_cuda(monkeypatch, module=layer.cuda_module())
    gates, hidden, batch, frames = layer.GATES[cell], 7, 3, 5
    width, saved = gates * hidden, (4 if cell == "gru" else 1) * hidden
    kernels = jnp.zeros((directions, hidden, width), jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[dtype]))
    biases, projected = jnp.zeros((directions, width), kernels.dtype), jnp.zeros((directions, batch, frames, width), kernels.dtype)
    mask = jnp.ones((directions, batch, frames), bool)

    def loss(kernels, biases, projected):
        return layer.persistent_recurrence(cell, 20.0, kernels, biases, projected, mask).astype(jnp.float32).sum()

    gradient = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    calls = custom_calls(gradient.trace(kernels, biases, projected).lower(lowering_platforms=("cuda",)).as_text())
    D, B, T, H, W, S = directions, batch, frames, hidden, width, saved  # noqa: N806  (the handlers' names)
    kernels_t, mask_t = f"tensor<{D}x{H}x{W}x{dtype}>", f"tensor<{D}x{B}x{T}xi1>"
    states_t, saved_t = f"tensor<{D}x{T + 1}x{B}x{H}x{dtype}>", f"tensor<{D}x{T}x{B}x{S}xf32>"
    outputs_t = f"tensor<{D}x{B}x{T}x{H}x{dtype}>"
    # The whole batch a block, a unit a block; the chunks: the whole depth padded to the tile, H going
    # forward, W going backward.
    assert calls == {
        "jaxring_persistent_rnn_forward": (
            B, 16, H, f"({kernels_t}, tensor<{D}x{W}x{dtype}>, tensor<{D}x{B}x{T}x{W}x{dtype}>, {mask_t}) -> "
               f"({outputs_t}, {states_t}, {saved_t})"),
        "jaxring_persistent_rnn_backward": (
            B, -(-W // 16) * 16, H, f"({kernels_t}, {mask_t}, {states_t}, {saved_t}, {outputs_t}) -> "
                                 f"(tensor<{D}x{T}x{B}x{W}x{dtype}>, tensor<{D}x{B}x{T}x{W}x{dtype}>)"),
    }


def test_persistent_trains_like_the_scan_under_pmap_over_two_host_devices():
    # Its own process with exactly 2 devices and XLA's pool as jaxring sizes it: with NPROC=2 (XLA's
    # own size on 2 cores) the host mirror's callbacks held the pool's threads and
    # `bench_train.py --host-devices 2 --set model.rnn_impl=persistent` hung (docs/PERSISTENT_RNN.md).
    env = {k: v for k, v in os.environ.items() if k != "NPROC"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run([sys.executable, "-m", "tests.jaxring.rnn.persistent_under_pmap"], cwd=ROOT, env=env,
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
