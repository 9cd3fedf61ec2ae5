"""The choice between the scan and the persistent layer, by implementation and device, and the persistent
layer's lowering on CUDA (Deep Speech 2 with each implementation: tests/models/deepspeech2/test_rnn_impl.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.rnn import layer
from jaxring.rnn.plan import A100, H100


def test_on_cpu_persistent_and_auto_keep_the_scan_saying_why():
    kernels, projected = jnp.zeros((2, 7, 21)), jnp.zeros((2, 3, 5, 21))
    assert layer.choose("scan", "gru", kernels, projected) == (False, None)
    for impl in ("persistent", "auto"):
        persistent, reason = layer.choose(impl, "gru", kernels, projected)
        assert not persistent and reason.startswith(f"{impl}: the scan on cpu") and "CUDA GPUs only" in reason


def test_on_cpu_the_persistent_op_is_refused_naming_the_scan():
    kernels, projected = jnp.zeros((1, 7, 7)), jnp.zeros((1, 3, 5, 7))
    with pytest.raises(RuntimeError, match=r"CUDA GPUs only, not on cpu; use the scan \(scan.scan_recurrence"):
        layer.persistent_recurrence("rnn", 20.0, kernels, jnp.zeros((1, 7)), projected, jnp.ones((1, 3, 5), bool))


# On CUDA (faked here: no GPU on the test machines), the choice by the device's own budget.
ds2_paper_layer = dict(kernels=jnp.zeros((2, 620, 3 * 620)), projected=jnp.zeros((2, 32, 5, 3 * 620)))


def on_cuda(monkeypatch, budget=H100, module=object()):
    monkeypatch.setattr(layer, "platform", lambda: "cuda")
    monkeypatch.setattr(layer, "cuda_module", lambda: module)
    monkeypatch.setattr(layer, "cuda_budget", lambda: budget)


def test_a_layer_that_does_not_fit_falls_back_to_the_scan_saying_why(monkeypatch):
    on_cuda(monkeypatch)
    kernels, projected = jnp.zeros((2, 4096, 3 * 4096)), jnp.zeros((2, 256, 2, 3 * 4096))
    persistent, reason = layer.choose("persistent", "gru", kernels, projected)
    assert not persistent and "does not fit" in reason and "4096" in reason


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
        assert not persistent and reason.startswith(f"{impl}:") and "does not fit" in reason and "A100" in reason


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
