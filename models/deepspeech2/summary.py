"""Size and cost of a Deep Speech 2 config: exact parameter count and analytic FLOPs."""

import jax
import numpy as np

from models.deepspeech2 import alphabet
from models.deepspeech2.model import (
    FRAMES_PER_SECOND,
    ModelConfig,
    init_variables,
    strided_length,
)


def count_params(config: ModelConfig) -> int:
    """Exact parameter count, from the shapes of the initialised `params` collection."""
    shapes = jax.eval_shape(lambda: init_variables(config, jax.random.key(0)))
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(shapes["params"])))


def _taps(size: int, kernel: int, stride: int) -> int:
    """Kernel taps that land inside the input, summed over the outputs of a 1D
    convolution padded by kernel // 2 on each side (taps on padding cost nothing)."""
    pad = kernel // 2
    starts = np.arange(0, size + 2 * pad - kernel + 1, stride) - pad
    return int(np.sum(np.minimum(starts + kernel, size) - np.maximum(starts, 0)))


def forward_flops(config: ModelConfig, frames: int) -> int:
    """FLOPs of one forward pass over one utterance of `frames` input frames,
    a multiply-add counted as 2.

    Only the matrix products and convolutions are counted: they are all but a
    few percent of the work.
    """
    flops = 0
    time, bins, channels = frames, config.num_features, 1
    for index in range(config.conv_layers):
        (freq_kernel, time_kernel), (freq_stride, time_stride) = config.conv_geometry(index)
        taps = _taps(time, time_kernel, time_stride) * _taps(bins, freq_kernel, freq_stride)
        flops += 2 * taps * channels * config.conv_channels[index]
        time, bins = strided_length(time, time_stride), strided_length(bins, freq_stride)
        channels = config.conv_channels[index]
    width = bins * channels
    directions = 2 if config.bidirectional else 1
    gates = config.rnn_gates
    hidden = config.rnn_hidden
    for _ in range(config.rnn_layers):
        flops += 2 * time * directions * gates * hidden * (width + hidden)  # input + recurrent
        width = hidden
    if not config.bidirectional:
        # frame t sees frames t..t+lookahead that exist
        taps = sum(min(config.lookahead + 1, time - t) for t in range(time))
        flops += 2 * taps * hidden
    flops += 2 * time * hidden * alphabet.SIZE
    return int(flops)


def flops_per_audio_second(config: ModelConfig, training: bool = True) -> int:
    """FLOPs per second of audio in a long utterance (the cost of one more second, so the
    edges of the convolutions do not count): forward only, or forward + backward
    (3x forward) when training."""
    one_more_second = forward_flops(config, 2 * FRAMES_PER_SECOND) - forward_flops(config, FRAMES_PER_SECOND)
    return (3 if training else 1) * one_more_second
