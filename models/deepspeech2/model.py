"""Deep Speech 2 (Amodei et al. 2015): 2D convolutions, recurrent layers, one fully connected layer.

Every layer keeps padded frames at zero and leaves them out of its batch-norm
statistics, so an utterance's logits do not depend on how much padding its
batch adds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxring.rnn import layer as rnn_layer
from jaxring.rnn.scan import clipped_relu, scan_recurrence
from models.deepspeech2 import alphabet

log = logging.getLogger(__name__)

FRAMES_PER_SECOND = 100  # 10 ms spectrogram stride

# (kernel, stride), each as (frequency, time): the paper's three convolutions, in order.
CONV_GEOMETRY = (
    ((41, 11), (2, 2)),
    ((21, 11), (2, 1)),
    ((21, 11), (2, 1)),
)
RNN_CELLS = ("gru", "rnn")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of a Deep Speech 2 network; the `model:` section of a config YAML."""

    num_features: int = 161  # 161: the spectrogram's bins (20 ms window at 16 kHz); fewer: mel bands
    # (models/deepspeech2/data/features.py)
    conv_layers: int = 2  # 1 to 3, the paper's kernels and strides in order
    time_stride: int = 2  # the first convolution's stride in time (the paper: 2 for characters, 3 for bigrams)
    conv_channels: tuple[int, ...] = (32, 32)  # one entry per conv layer
    rnn_cell: str = "gru"  # "gru" or "rnn" (simple RNN with clipped ReLU)
    rnn_layers: int = 5  # recurrent layers after the convolutions
    rnn_hidden: int = 800  # units of each recurrent layer (per direction)
    bidirectional: bool = True  # directions summed; otherwise a lookahead convolution follows
    lookahead: int = 20  # future frames the lookahead convolution sees (unidirectional only)
    relu_clip: float = 20.0  # the clipped ReLU's ceiling: min(max(x, 0), relu_clip)
    batch_norm_momentum: float = 0.99  # of the batch norms' running statistics
    batch_norm_epsilon: float = 1e-5  # added to the batch variance before its square root
    dtype: str = "float32"  # compute dtype; parameters stay float32
    scan_unroll: int = 1  # time steps per iteration of the recurrent loop
    # "scan": jax.lax.scan; "persistent": one kernel per layer with the weights on chip, on CUDA
    # GPUs (docs/PERSISTENT_RNN.md), elsewhere the scan with a warning; "auto": persistent where it
    # runs and fits, else the scan.
    rnn_impl: str = "scan"

    def __post_init__(self):
        if not 1 <= self.conv_layers <= len(CONV_GEOMETRY):
            raise ValueError(f"model.conv_layers must be 1, 2 or 3, got {self.conv_layers}")
        if len(self.conv_channels) != self.conv_layers:
            raise ValueError(
                f"model.conv_channels has {len(self.conv_channels)} entries but "
                f"model.conv_layers is {self.conv_layers}; give one channel count per conv layer"
            )
        if self.rnn_cell not in RNN_CELLS:
            raise ValueError(f"model.rnn_cell must be one of {RNN_CELLS}, got {self.rnn_cell!r}")
        if self.rnn_impl not in rnn_layer.IMPLEMENTATIONS:
            raise ValueError(
                f"model.rnn_impl must be one of {rnn_layer.IMPLEMENTATIONS}, got {self.rnn_impl!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        positive = dict(
            num_features=self.num_features,
            rnn_layers=self.rnn_layers,
            rnn_hidden=self.rnn_hidden,
            scan_unroll=self.scan_unroll,
            time_stride=self.time_stride,
            **{f"conv_channels[{i}]": c for i, c in enumerate(self.conv_channels)},
        )
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"model.{name} must be at least 1, got {value}")
        if self.lookahead < 0:
            raise ValueError(f"model.lookahead must be >= 0, got {self.lookahead}")

    def conv_geometry(self, index: int):
        """((freq kernel, time kernel), (freq stride, time stride)) of convolution `index`."""
        kernel, (freq_stride, time_stride) = CONV_GEOMETRY[index]
        return kernel, (freq_stride, self.time_stride if index == 0 else time_stride)

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def rnn_gates(self) -> int:
        """Blocks of the input projection per direction: reset, update, candidate for a GRU."""
        return 3 if self.rnn_cell == "gru" else 1


def strided_length(size, stride: int):
    """Outputs of a convolution padded by (kernel - 1) / 2 on both sides: ceil(size / stride)."""
    return (size - 1) // stride + 1


def output_lengths(config: ModelConfig, lengths):
    """Output frames for `lengths` input frames (numpy or jax arrays, or ints)."""
    for index in range(config.conv_layers):
        _, (_, time_stride) = config.conv_geometry(index)
        lengths = strided_length(lengths, time_stride)
    return lengths


def frame_mask(lengths, frames: int):
    """[B, T] bool, True on real frames."""
    return jnp.arange(frames)[None, :] < lengths[:, None]


def _zero_padding(x, mask):
    """Zeroes padded frames of x [B, T, ...] so they cannot leak into real frames."""
    return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, 0)


class MaskedBatchNorm(nn.Module):
    """Batch norm over the last axis with statistics from real frames only.

    The statistics are gathered as sums and counts, so with `axis_name` they
    are exact over the real frames of all replicas however unevenly the
    replicas are filled, and a batch with no real frame leaves the running
    averages as they were instead of turning them into NaN.
    """

    momentum: float
    epsilon: float
    dtype: Any
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, mask, train: bool):
        """x [B, T, ..., C]; mask [B, T] bool."""
        features = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (features,))
        bias = self.param("bias", nn.initializers.zeros, (features,))
        running_mean = self.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32)
        running_var = self.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32)
        x32 = x.astype(jnp.float32)
        if train:
            weight = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x.shape[:-1] + (1,))
            weight = weight.astype(jnp.float32)
            axes = tuple(range(x.ndim - 1))
            sums = jnp.stack([(x32 * weight).sum(axes), (x32 * x32 * weight).sum(axes)])
            count = weight.sum()
            if self.axis_name is not None and not self.is_initializing():
                sums, count = jax.lax.psum((sums, count), self.axis_name)
            mean = sums[0] / jnp.maximum(count, 1)
            var = jnp.maximum(sums[1] / jnp.maximum(count, 1) - mean * mean, 0)
            if not self.is_initializing():
                seen = count > 0
                running_mean.value = jnp.where(
                    seen, self.momentum * running_mean.value + (1 - self.momentum) * mean, running_mean.value
                )
                running_var.value = jnp.where(
                    seen, self.momentum * running_var.value + (1 - self.momentum) * var, running_var.value
                )
        else:
            mean, var = running_mean.value, running_var.value
        y = (x32 - mean) * (scale * jax.lax.rsqrt(var + self.epsilon)) + bias
        return y.astype(self.dtype)


def conv_direct(x, kernel, stride):
    """x [B, T, F, C] convolved with kernel [time, freq, C, out], "same" padding: one 2-D convolution."""
    pads = [(size // 2, size // 2) for size in kernel.shape[:2]]
    return jax.lax.conv_general_dilated(x, kernel, stride, pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_frames_as_channels(x, kernel, stride):
    """conv_direct's sum as a 1-D convolution over frequency whose channels are the frames under the kernel.

    XLA's CPU convolution is slow for the paper's tall kernels on few input
    channels: the 11 x 41 kernel on the spectrogram took 90 ms of a 250 ms
    ds2_tiny step, this form 25 ms.
    """
    time_kernel, freq_kernel, channels, features = kernel.shape
    time_stride, freq_stride = stride
    batch, frames, bins, _ = x.shape
    out_frames = strided_length(frames, time_stride)
    padded = jnp.pad(x, ((0, 0), (time_kernel // 2,) * 2, (0, 0), (0, 0)))
    last = time_stride * (out_frames - 1) + 1
    windows = jnp.stack([padded[:, dt : dt + last : time_stride] for dt in range(time_kernel)], axis=3)
    windows = windows.reshape(batch * out_frames, bins, time_kernel * channels)
    # [time, freq, in, out] -> [freq, time * in, out]: the order the windows stack in
    kernel_1d = kernel.transpose(1, 0, 2, 3).reshape(freq_kernel, time_kernel * channels, features)
    y = jax.lax.conv_general_dilated(
        windows, kernel_1d, (freq_stride,), [(freq_kernel // 2,) * 2], dimension_numbers=("NWC", "WIO", "NWC")
    )
    return y.reshape(batch, out_frames, y.shape[1], features)


class TimeFrequencyConv(nn.Module):
    """nn.Conv over (time, frequency) with "same" padding and no bias, fast on CPUs too:
    conv_frames_as_channels there, the 2-D convolution other platforms' libraries are tuned for elsewhere."""

    features: int
    kernel: tuple[int, int]  # (time, frequency)
    stride: tuple[int, int]
    dtype: Any

    @nn.compact
    def __call__(self, x):
        """x [B, T, F, C] -> [B, ceil(T / time stride), ceil(F / frequency stride), features]."""
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (*self.kernel, x.shape[-1], self.features))
        x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        return jax.lax.platform_dependent(
            x, kernel,
            cpu=lambda x, k: conv_frames_as_channels(x, k, self.stride),
            default=lambda x, k: conv_direct(x, k, self.stride),
        )


class ConvBlock(nn.Module):
    """Convolution over (time, frequency), masked batch norm, clipped ReLU."""

    config: ModelConfig
    index: int
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, mask, train: bool):
        (freq_kernel, time_kernel), (freq_stride, time_stride) = self.config.conv_geometry(self.index)
        x = TimeFrequencyConv(
            self.config.conv_channels[self.index],
            kernel=(time_kernel, freq_kernel),
            stride=(time_stride, freq_stride),
            dtype=self.config.compute_dtype,
            name="Conv_0",  # the path flax's nn.Conv gave the kernel, so earlier checkpoints load
        )(x)
        mask = mask[:, ::time_stride]  # ceil(L / s) frames stay real, as in output_lengths
        x = MaskedBatchNorm(
            self.config.batch_norm_momentum, self.config.batch_norm_epsilon, self.config.compute_dtype, self.axis_name
        )(x, mask, train)
        return _zero_padding(clipped_relu(x, self.config.relu_clip), mask), mask


class RecurrentWeights(nn.Module):
    """One direction's recurrent kernel [H, gates * H] and, for a GRU, its bias [gates * H]."""

    config: ModelConfig

    @nn.compact
    def __call__(self):
        cfg = self.config
        hidden, gates = cfg.rnn_hidden, cfg.rnn_gates
        kernel = self.param(
            "recurrent_kernel", nn.initializers.orthogonal(column_axis=-1), (hidden, gates * hidden)
        )
        if cfg.rnn_cell != "gru":
            return kernel, jnp.zeros((gates * hidden,), kernel.dtype)
        # The candidate's recurrent bias sits inside the reset gate, so batch
        # norm's offset on the input cannot stand in for it.
        return kernel, self.param("recurrent_bias", nn.initializers.zeros, (gates * hidden,))


@functools.cache
def _log_once(line: str, level: int) -> None:
    """Logs `line` the first time only: the model is traced once per layer, and again per compiled shape."""
    log.log(level, line)


def recurrence(config: ModelConfig, kernels, biases, projected, mask):
    """Runs D directions side by side over time, by config.rnn_impl (jaxring/rnn/layer.py picks).

    kernels [D, H, gates * H], biases [D, gates * H], projected [D, B, T, gates * H]
    (already normalised), mask [D, B, T]; each direction's frames in the order it
    reads them. Returns [D, B, T, H] in the compute dtype, zero on padded frames.
    """
    kernels = kernels.astype(config.compute_dtype)
    biases = biases.astype(config.compute_dtype)
    projected = projected.astype(config.compute_dtype)
    persistent, fallback = rnn_layer.choose(config.rnn_impl, config.rnn_cell, kernels, projected)
    if fallback:
        # The scan where the persistent layer was asked for by name is a warning; where auto chose it, news.
        _log_once(f"model.rnn_impl={fallback}", logging.WARNING if config.rnn_impl == "persistent" else logging.INFO)
    if persistent:
        return rnn_layer.persistent_recurrence(config.rnn_cell, config.relu_clip, kernels, biases, projected, mask)
    return scan_recurrence(config.rnn_cell, config.relu_clip, config.scan_unroll, kernels, biases, projected, mask)


class RecurrentLayer(nn.Module):
    """Input projection, sequence-wise batch norm over real frames, one or two directions summed."""

    config: ModelConfig
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, mask, train: bool):
        cfg = self.config
        directions = ("forward", "backward") if cfg.bidirectional else ("forward",)
        projected = nn.Dense(
            len(directions) * cfg.rnn_gates * cfg.rnn_hidden,
            use_bias=False,  # batch norm supplies the offset
            dtype=cfg.compute_dtype,
            name="input_projection",
        )(x)
        projected = MaskedBatchNorm(
            cfg.batch_norm_momentum, cfg.batch_norm_epsilon, cfg.compute_dtype, self.axis_name
        )(projected, mask, train)
        per_direction = jnp.split(projected, len(directions), axis=-1)
        kernels, biases = zip(*(RecurrentWeights(cfg, name=name)() for name in directions))
        # The backward direction reads time reversed: flipped in, flipped back out.
        time_order = [lambda a: a, lambda a: jnp.flip(a, axis=1)][: len(directions)]
        outputs = recurrence(
            cfg,
            jnp.stack(kernels),
            jnp.stack(biases),
            jnp.stack([order(p) for order, p in zip(time_order, per_direction)]),
            jnp.stack([order(mask) for order in time_order]),
        )
        return sum(order(out) for order, out in zip(time_order, outputs))


class Lookahead(nn.Module):
    """Row convolution: each unit mixes its own activations over the next `lookahead` frames."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, mask):
        cfg = self.config
        x = nn.Conv(
            cfg.rnn_hidden,
            kernel_size=(cfg.lookahead + 1,),
            padding=((0, cfg.lookahead),),
            feature_group_count=cfg.rnn_hidden,
            use_bias=False,
            dtype=cfg.compute_dtype,
        )(x)
        return _zero_padding(clipped_relu(x, cfg.relu_clip), mask)


class DeepSpeech2(nn.Module):
    """features [B, T, num_features], lengths [B] -> (logits [B, T', 29] float32, out_lengths [B])."""

    config: ModelConfig
    axis_name: str | None = None  # batch-norm statistics stay per replica unless set (pmap axis)

    @nn.compact
    def __call__(self, features, lengths, train: bool):
        cfg = self.config
        if features.ndim != 3 or features.shape[-1] != cfg.num_features:
            raise ValueError(
                f"features must be [batch, frames, {cfg.num_features}], got shape {features.shape}"
            )
        lengths = jnp.asarray(lengths, jnp.int32)
        mask = frame_mask(lengths, features.shape[1])
        x = _zero_padding(features.astype(cfg.compute_dtype), mask)[..., None]
        for index in range(cfg.conv_layers):
            x, mask = ConvBlock(cfg, index, self.axis_name, name=f"conv{index}")(x, mask, train)
        x = x.reshape(x.shape[:2] + (-1,))  # [B, T', bins * channels]
        for index in range(cfg.rnn_layers):
            x = RecurrentLayer(cfg, self.axis_name, name=f"rnn{index}")(x, mask, train)
        if not cfg.bidirectional:
            x = Lookahead(cfg, name="lookahead")(x, mask)
        logits = nn.Dense(alphabet.SIZE, dtype=cfg.compute_dtype, name="output")(x)
        return logits.astype(jnp.float32), output_lengths(cfg, lengths)


def init_variables(config: ModelConfig, rng, frames: int = 64, batch: int = 1):
    """Initial `params` and `batch_stats` for a config."""
    features = jnp.zeros((batch, frames, config.num_features), jnp.float32)
    lengths = jnp.full((batch,), frames, jnp.int32)
    # Compiled: initialising op by op costs seconds even for a tiny model.
    return jax.jit(DeepSpeech2(config).init, static_argnames="train")(rng, features, lengths, train=False)

