"""The persistent layer with the host mirror (host_mirror.py) in place of its CUDA kernels, as on an H100: the
layer's choice, plan and custom VJP run as on the GPU, the mirror called back from the compiled program. Far slower
than the scan (numpy, one block at a time): it proves the kernels' split inside the real model, no more."""

import types

import jax
import numpy as np

from jaxring.rnn import layer
from jaxring.rnn.plan import H100
from tests.jaxring.rnn import host_mirror

# Where the lowered program names the real kernels: never, with the mirror in their place.
STAND_IN_MODULE = types.SimpleNamespace(FORWARD_TARGET="jaxring_persistent_rnn_forward",
                                        BACKWARD_TARGET="jaxring_persistent_rnn_backward")


def _cell(kernels) -> str:
    """A GRU or a plain RNN by the kernels' width, as the handlers (jaxring/rnn/csrc/module_rnn_cuda.cc) tell them."""
    return "gru" if kernels.shape[2] == 3 * kernels.shape[1] else "rnn"


def _callback(function, results, *args):
    return jax.pure_callback(function, results, *args, vmap_method="sequential")


def forward_on_the_mirror(relu_clip, plan, results, kernels, biases, projected, mask):
    """layer.forward_kernel's results from host_mirror.forward."""
    def run(kernels, biases, projected, mask):
        arrays = (np.asarray(a) for a in (kernels, biases, projected, mask))
        return host_mirror.forward(_cell(kernels), relu_clip, plan, *arrays, np.random.default_rng(0))

    return _callback(run, results, kernels, biases, projected, mask)


def backward_on_the_mirror(relu_clip, plan, results, kernels, mask, states, saved, d_outputs):
    """layer.backward_kernel's results from host_mirror.backward."""
    def run(kernels, mask, states, saved, d_outputs):
        arrays = (np.asarray(a) for a in (kernels, mask, states, saved, d_outputs))
        return host_mirror.backward(_cell(kernels), relu_clip, plan, *arrays, np.random.default_rng(0))

    return _callback(run, results, kernels, mask, states, saved, d_outputs)


def stand_in_for_the_kernels(patch=setattr):
    """Runs jaxring.rnn.layer's persistent layer on the mirror, as on an H100. `patch`: pytest's
    monkeypatch.setattr in a test, which undoes it after."""
    patch(layer, "platform", lambda: "cuda")
    patch(layer, "cuda_module", lambda: STAND_IN_MODULE)
    patch(layer, "cuda_budget", lambda: H100)
    patch(layer, "forward_kernel", forward_on_the_mirror)
    patch(layer, "backward_kernel", backward_on_the_mirror)
