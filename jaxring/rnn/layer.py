"""model.rnn_impl's choice between the scan and the persistent layer, and the persistent layer as a JAX op.

On CPU the persistent layer is the host mirror (host_mirror.py) called back from
the compiled program, with a custom VJP running the mirror's backward pass: it
proves the kernel's split and barriers inside the real model, far slower than
the scan. The CUDA kernel is not written yet (docs/PERSISTENT_RNN.md, "Status"),
so on a GPU `persistent` is refused and `auto` keeps the scan.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.rnn import host_mirror
from jaxring.rnn.plan import H100, Plan, plan_layer

IMPLEMENTATIONS = ("scan", "persistent", "auto")
GATES = {"gru": 3, "rnn": 1}
# The split the host mirror runs: the one the kernel would use on an H100.
MIRRORED_DEVICE = H100


def layer_plan(cell: str, kernels, projected) -> Plan | str:
    """The split of a layer with `kernels` [D, H, gates * H] and `projected` [D, B, T, gates * H], or why none fits."""
    directions, hidden = kernels.shape[:2]
    return plan_layer(hidden, GATES[cell], projected.shape[1], directions,
                      np.dtype(projected.dtype).itemsize, MIRRORED_DEVICE)


def choose(impl: str, cell: str, kernels, projected) -> tuple[bool, str | None]:
    """(whether to run the persistent layer, the sentence to log when `impl` asked for it and the scan runs)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"model.rnn_impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "scan":
        return False, None
    platform = jax.default_backend()
    if platform != "cpu":
        if impl == "persistent":
            raise NotImplementedError(
                f"model.rnn_impl=persistent: the CUDA kernel of the persistent layer is not written yet, so it "
                f"cannot run on {platform} (docs/PERSISTENT_RNN.md, 'Status'); set model.rnn_impl=scan or auto"
            )
        return False, f"model.rnn_impl=auto: the scan on {platform}, the persistent CUDA kernel is not written yet"
    if impl == "auto":
        return False, "model.rnn_impl=auto: the scan on cpu, where the persistent layer is the slow host mirror"
    plan = layer_plan(cell, kernels, projected)
    if isinstance(plan, str):
        return False, f"model.rnn_impl=persistent: the scan, the layer does not fit: {plan}"
    return True, None


def _callback(function, results, *args):
    return jax.pure_callback(function, results, *args, vmap_method="sequential")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def persistent_recurrence(cell: str, relu_clip: float, kernels, biases, projected, mask):
    """models/deepspeech2/model.py's `recurrence` by the persistent layer's split: [D, B, T, H]."""
    return _forward(cell, relu_clip, kernels, biases, projected, mask)[0]


def _accumulator_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _forward(cell, relu_clip, kernels, biases, projected, mask):
    plan = layer_plan(cell, kernels, projected)
    if isinstance(plan, str):
        raise ValueError(f"persistent_recurrence: {plan}; use the scan (model.rnn_impl=auto falls back to it)")
    directions, batch, frames, _ = projected.shape
    hidden, dtype = plan.hidden, projected.dtype
    results = (
        jax.ShapeDtypeStruct((directions, batch, frames, hidden), dtype),
        jax.ShapeDtypeStruct((directions, frames + 1, batch, hidden), dtype),
        jax.ShapeDtypeStruct((directions, frames, batch, host_mirror.saved_width(cell, hidden)),
                             _accumulator_dtype(dtype)),
    )

    def run(kernels, biases, projected, mask):
        return host_mirror.forward(cell, relu_clip, plan, np.asarray(kernels), np.asarray(biases),
                                   np.asarray(projected), np.asarray(mask), np.random.default_rng(0))

    outputs, states, saved = _callback(run, results, kernels, biases, projected, mask)
    return outputs, (kernels, biases, mask, states, saved)


def _backward(cell, relu_clip, residuals, d_outputs):
    kernels, biases, mask, states, saved = residuals
    directions, frames, batch, hidden = states.shape[0], states.shape[1] - 1, states.shape[2], states.shape[3]
    width = kernels.shape[-1]
    plan = plan_layer(hidden, GATES[cell], batch, directions, np.dtype(d_outputs.dtype).itemsize, MIRRORED_DEVICE)
    acc = _accumulator_dtype(d_outputs.dtype)
    results = (
        jax.ShapeDtypeStruct(kernels.shape, acc),
        jax.ShapeDtypeStruct(biases.shape, acc),
        jax.ShapeDtypeStruct((directions, batch, frames, width), d_outputs.dtype),
    )

    def run(kernels, mask, states, saved, d_outputs):
        return host_mirror.backward(cell, relu_clip, plan, np.asarray(kernels), np.asarray(mask),
                                    np.asarray(states), np.asarray(saved), np.asarray(d_outputs),
                                    np.random.default_rng(0))

    d_kernels, d_biases, d_projected = _callback(run, results, kernels, mask, states, saved, d_outputs)
    return d_kernels.astype(kernels.dtype), d_biases.astype(biases.dtype), d_projected, None


persistent_recurrence.defvjp(_forward, _backward)
