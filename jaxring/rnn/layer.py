"""The choice of a recurrent layer's implementation (the scan of scan.py or the persistent layer), and the
persistent layer as a JAX op.

The persistent layer is the kernel of csrc/persistent_rnn.cu, called through the XLA FFI
handlers of csrc/module_rnn_cuda.cc, with a custom VJP running the backward kernel; its
split is planned for the GPU it runs on. It runs on CUDA only: elsewhere `persistent`
and `auto` choose the scan, saying why. The tests prove the split and its barriers
against the scan on a numpy mirror of the kernel (tests/jaxring/rnn/host_mirror.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.rnn.plan import DeviceBudget, Plan, plan_layer

# "auto": the persistent layer where its kernel runs and the layer fits, else the scan.
IMPLEMENTATIONS = ("scan", "persistent", "auto")
GATES = {"gru": 3, "rnn": 1}
# The CUDA kernel's storage types (csrc/persistent_rnn.h's Storage); it accumulates in float32.
KERNEL_DTYPES = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16))
_REBUILD = "rebuild jaxring where nvcc is on the PATH (pip install --no-build-isolation -e .)"


@functools.cache
def cuda_module():
    """The compiled CUDA handlers, registered with XLA, or None where jaxring was built without a CUDA toolkit."""
    try:
        from jaxring.rnn import _jaxring_rnn_cuda
    except ImportError:
        return None
    for name, capsule in _jaxring_rnn_cuda.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    return _jaxring_rnn_cuda


def platform() -> str:
    """The default backend: "cpu", "cuda", or its other name (ROCm's GPUs are "rocm", not "cuda")."""
    backend = jax.default_backend()
    if backend != "gpu":
        return backend
    return "rocm" if "rocm" in jax.devices()[0].client.platform_version.lower() else "cuda"


@functools.cache
def cuda_budget() -> DeviceBudget | str:
    """The first local GPU's budget for the kernel, or why the kernel cannot run on it."""
    module = cuda_module()
    if module is None:
        return f"jaxring was built without the persistent layer's CUDA handlers; {_REBUILD}"
    budget = module.device_budget(jax.local_devices()[0].local_hardware_id)
    if not budget["cooperative_launch"]:
        return f"{budget['name']} cannot launch cooperative grids, which the kernel's grid barrier needs"
    return DeviceBudget(budget["name"], budget["sms"], budget["shared_bytes_per_block"])


def layer_plan(cell: str, hidden: int, directions: int, batch: int, dtype) -> Plan | str:
    """The split of a layer on this CUDA device, or why none fits."""
    if np.dtype(dtype) not in KERNEL_DTYPES:
        return f"the CUDA kernel computes in float32 or bfloat16, not {np.dtype(dtype).name}"
    budget = cuda_budget()
    if isinstance(budget, str):
        return budget
    return plan_layer(hidden, GATES[cell], batch, directions, np.dtype(dtype).itemsize, budget)


def saved_width(cell: str, hidden: int) -> int:
    """Values per frame the forward kernel keeps for the backward one: r, z, n and the candidate's
    recurrent term for a GRU, the pre-activation for a plain RNN."""
    return 4 * hidden if cell == "gru" else hidden


def choose(impl: str, cell: str, kernels, projected) -> tuple[bool, str | None]:
    """(whether implementation `impl` (one of IMPLEMENTATIONS) runs the persistent layer here, the sentence
    to log when `impl` asked for it and the scan runs).

    `kernels` [D, H, gates * H], `projected` [D, B, T, gates * H], as scan.scan_recurrence takes them."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"the recurrent layer's implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "scan":
        return False, None
    here = platform()
    if here != "cuda":
        return False, f"{impl}: the scan on {here}, the persistent layer's kernel runs on CUDA GPUs only"
    if impl == "persistent" and cuda_module() is None:
        raise RuntimeError(f"persistent on CUDA: jaxring was built without the persistent layer's "
                           f"CUDA handlers (jaxring/rnn/_jaxring_rnn_cuda); {_REBUILD}, or choose auto")
    directions, hidden = kernels.shape[:2]
    plan = layer_plan(cell, hidden, directions, projected.shape[1], projected.dtype)
    if isinstance(plan, str):
        return False, f"{impl}: the scan on {here}, the layer does not fit: {plan}"
    return True, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def persistent_recurrence(cell: str, relu_clip: float, kernels, biases, projected, mask):
    """scan.scan_recurrence by the persistent layer's split, on a CUDA GPU: [D, B, T, H]."""
    return _forward(cell, relu_clip, kernels, biases, projected, mask)[0]


def _plan(cell: str, hidden: int, directions: int, batch: int, dtype) -> Plan:
    if platform() != "cuda":
        raise RuntimeError(f"persistent_recurrence: the kernel runs on CUDA GPUs only, not on {platform()}; use the "
                         "scan (scan.scan_recurrence; `choose` picks it there)")
    plan = layer_plan(cell, hidden, directions, batch, dtype)
    if isinstance(plan, str):
        raise ValueError(f"persistent_recurrence: {plan}; use the scan (the implementation auto falls back to it)")
    return plan


def _forward(cell, relu_clip, kernels, biases, projected, mask):
    directions, batch, frames, _ = projected.shape
    hidden, dtype = kernels.shape[1], projected.dtype
    plan = _plan(cell, hidden, directions, batch, dtype)
    results = (
        jax.ShapeDtypeStruct((directions, batch, frames, hidden), dtype),
        jax.ShapeDtypeStruct((directions, frames + 1, batch, hidden), dtype),
        jax.ShapeDtypeStruct((directions, frames, batch, saved_width(cell, hidden)), jnp.float32),
    )
    mask = mask.astype(jnp.bool_)
    outputs, states, saved = forward_kernel(relu_clip, plan, results, kernels, biases, projected, mask)
    return outputs, (kernels, biases, mask, states, saved)


def forward_kernel(relu_clip, plan, results, kernels, biases, projected, mask):
    """The forward kernel's custom call: (outputs [D, B, T, H], states [D, T + 1, B, H], saved [D, T, B, S]);
    the handler tells a GRU from a plain RNN by the kernels' width."""
    return jax.ffi.ffi_call(cuda_module().FORWARD_TARGET, results)(
        kernels, biases, projected, mask, unit_groups=np.int64(plan.unit_groups), batch_rows=np.int64(plan.batch_rows),
        chunk=np.int64(plan.forward_chunk), relu_clip=np.float32(relu_clip))


def backward_kernel(relu_clip, plan, results, kernels, mask, states, saved, d_outputs):
    """The backward kernel's custom call: (d_recurrent [D, T, B, W], d_projected [D, B, T, W])."""
    return jax.ffi.ffi_call(cuda_module().BACKWARD_TARGET, results)(
        kernels, mask, states, saved, d_outputs, unit_groups=np.int64(plan.unit_groups),
        batch_rows=np.int64(plan.batch_rows), chunk=np.int64(plan.backward_chunk), relu_clip=np.float32(relu_clip))


def weight_gradients(states, d_recurrent, accumulator):
    """The kernel and bias gradients [D, H, W], [D, W] from every frame's recurrent-input gradient
    `d_recurrent` [D, T, B, W] and the state before it, `states` [D, T + 1, B, H]: sums over frames and
    utterances, one large product (accumulating in `accumulator`) instead of a small one per frame."""
    d_kernels = jnp.einsum("dtbh,dtbw->dhw", states[:, :-1], d_recurrent, preferred_element_type=accumulator)
    return d_kernels, jnp.sum(d_recurrent, axis=(1, 2), dtype=accumulator)


def _backward(cell, relu_clip, residuals, d_outputs):
    kernels, biases, mask, states, saved = residuals
    directions, frames, batch, hidden = states.shape[0], states.shape[1] - 1, states.shape[2], states.shape[3]
    width, dtype = kernels.shape[-1], d_outputs.dtype
    plan = _plan(cell, hidden, directions, batch, dtype)
    results = (
        jax.ShapeDtypeStruct((directions, frames, batch, width), dtype),
        jax.ShapeDtypeStruct((directions, batch, frames, width), dtype),
    )
    d_recurrent, d_projected = backward_kernel(relu_clip, plan, results, kernels, mask, states, saved, d_outputs)
    d_kernels, d_biases = weight_gradients(states, d_recurrent, jnp.float32)
    return d_kernels.astype(kernels.dtype), d_biases.astype(biases.dtype), d_projected, None


persistent_recurrence.defvjp(_forward, _backward)
