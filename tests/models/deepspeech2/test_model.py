"""Deep Speech 2 network: shapes, output lengths, padding invariance, parameter counts, configs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models  # noqa: F401  (registers deepspeech2)
from jaxring.engine.experiment import load_config
from jaxring.engine import config as config_lib
from models.deepspeech2 import alphabet
from models.deepspeech2.ctc import ctc_loss
from models.deepspeech2.model import (
    DeepSpeech2,
    ModelConfig,
    RecurrentLayer,
    conv_direct,
    conv_frames_as_channels,
    init_variables,
    output_lengths,
)
from models.deepspeech2.summary import count_params


def tiny(**overrides) -> ModelConfig:
    fields = dict(conv_layers=1, conv_channels=(3,), rnn_layers=2, rnn_hidden=8)
    return ModelConfig(**{**fields, **overrides})


# Compiling dominates these tests, so the configs, their variables and their
# compiled apply functions are shared between tests.
ONE_CONV = tiny()
TWO_CONV = tiny(conv_layers=2, conv_channels=(3, 2), rnn_cell="rnn", rnn_layers=1)
THREE_CONV_LOOKAHEAD = tiny(conv_layers=3, conv_channels=(2, 2, 4), rnn_layers=1, bidirectional=False, lookahead=3)
FRAMES = 23


@functools.cache
def variables_of(config):
    return init_variables(config, jax.random.key(0))


@functools.cache
def compiled_apply(config):
    return jax.jit(DeepSpeech2(config).apply, static_argnames=("train", "mutable"))


def random_batch(rng, lengths, frames=FRAMES, features=161):
    x = rng.standard_normal((len(lengths), frames, features)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(lengths, jnp.int32)


def run(config, features, lengths, train, variables=None):
    variables = variables_of(config) if variables is None else variables
    return compiled_apply(config)(variables, features, lengths, train=train, mutable=("batch_stats",))


@pytest.mark.parametrize(
    "config",
    [ONE_CONV, TWO_CONV, THREE_CONV_LOOKAHEAD],
    ids=["1conv-gru-bi", "2conv-rnn-bi", "3conv-gru-lookahead"],
)
def test_shapes_and_lengths(config):
    rng = np.random.default_rng(0)
    features, lengths = random_batch(rng, [23, 1, 10])  # odd sizes, a one-frame utterance
    (logits, out_lengths), _ = run(config, features, lengths, train=True)
    # Only the first convolution strides in time (2x), whatever the depth.
    assert logits.shape == (3, 12, alphabet.SIZE)
    assert logits.dtype == jnp.float32
    np.testing.assert_array_equal(out_lengths, [12, 1, 5])
    np.testing.assert_array_equal(output_lengths(config, np.array([23, 1, 10, 0])), [12, 1, 5, 0])
    assert np.isfinite(np.asarray(logits)).all()


def test_time_stride_sets_the_output_frames():
    config = tiny(conv_layers=2, conv_channels=(2, 3), time_stride=3)
    features, lengths = random_batch(np.random.default_rng(0), [23, 1, 10, 3])
    (logits, out_lengths), _ = run(config, features, lengths, train=True)
    assert logits.shape == (4, 8, alphabet.SIZE)  # ceil(23 / 3)
    np.testing.assert_array_equal(out_lengths, [8, 1, 4, 1])
    np.testing.assert_array_equal(output_lengths(config, np.array([23, 1, 10, 3, 0])), [8, 1, 4, 1, 0])


@pytest.mark.parametrize("config", [ONE_CONV, THREE_CONV_LOOKAHEAD], ids=["bidirectional", "lookahead"])
def test_padding_does_not_change_outputs_or_statistics(config):
    rng = np.random.default_rng(1)
    features, lengths = random_batch(rng, [17, 9, 4])
    # The same utterances with 14 more frames of padding, and garbage in all padding.
    padded = jnp.concatenate([features, jnp.asarray(rng.standard_normal((3, 14, 161)) * 100, jnp.float32)], axis=1)
    padded = padded.at[:, 17:].set(100.0).at[1, 9:].set(55.0).at[2, 4:].set(-7.0)

    (logits, out_lengths), stats = run(config, features, lengths, train=True)
    (logits_p, out_lengths_p), stats_p = run(config, padded, lengths, train=True)
    np.testing.assert_array_equal(out_lengths, out_lengths_p)
    for i, n in enumerate(np.asarray(out_lengths)):
        np.testing.assert_allclose(logits[i, :n], logits_p[i, :n], rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(stats_p)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # In inference an utterance's output does not depend on its batch either.
    (alone, _), _ = run(config, features[1:2, :9], lengths[1:2], train=False)
    (in_batch, _), _ = run(config, padded, lengths, train=False)
    np.testing.assert_allclose(alone[0], in_batch[1, : alone.shape[1]], rtol=1e-5, atol=1e-5)


def test_batch_norm_statistics_come_from_real_frames_only():
    rng = np.random.default_rng(2)
    features, lengths = random_batch(rng, [6, 3, 11])
    _, stats = run(ONE_CONV, features, lengths, train=True)
    # Reference: the running mean update of the first conv's batch norm, computed by hand.
    kernel = variables_of(ONE_CONV)["params"]["conv0"]["Conv_0"]["kernel"]  # [11 time, 41 freq, 1, C]
    x = jnp.where(jnp.arange(FRAMES)[None, :, None] < lengths[:, None, None], features, 0)[..., None]
    conv = jax.lax.conv_general_dilated(
        x, kernel, (2, 2), ((5, 5), (20, 20)), dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    real = np.concatenate([np.asarray(conv[0, :3]), np.asarray(conv[1, :2]), np.asarray(conv[2, :6])])  # ceil(L/2)
    expected_mean = 0.01 * real.reshape(-1, real.shape[-1]).astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(stats["batch_stats"]["conv0"]["MaskedBatchNorm_0"]["mean"], expected_mean, rtol=1e-4, atol=1e-7)


def test_batch_without_real_frames_leaves_statistics_alone():
    features, _ = random_batch(np.random.default_rng(5), [0, 0, 0])
    (logits, out_lengths), stats = run(ONE_CONV, features, jnp.zeros(3, jnp.int32), train=True)
    np.testing.assert_array_equal(out_lengths, 0)
    assert np.isfinite(np.asarray(logits)).all()
    for new, old in zip(jax.tree.leaves(stats), jax.tree.leaves(variables_of(ONE_CONV)["batch_stats"])):
        np.testing.assert_array_equal(new, old)


def test_statistics_across_replicas_equal_one_replica_with_the_whole_batch():
    # Two replicas, unevenly filled: the first holds 17 + 9 real frames, the second 4 + 0.
    features, lengths = random_batch(np.random.default_rng(6), [17, 9, 4, 0])
    variables = variables_of(ONE_CONV)
    replicated = jax.tree.map(lambda v: jnp.stack([v, v]), variables)
    apply = jax.pmap(
        lambda v, x, n: DeepSpeech2(ONE_CONV, axis_name="replicas").apply(v, x, n, train=True, mutable=["batch_stats"]),
        axis_name="replicas",
    )
    (logits, _), stats = apply(replicated, features.reshape(2, 2, FRAMES, 161), lengths.reshape(2, 2))
    (whole_logits, out_lengths), whole_stats = run(ONE_CONV, features, lengths, train=True)
    logits = logits.reshape(whole_logits.shape)
    for i, n in enumerate(np.asarray(out_lengths)):
        np.testing.assert_allclose(logits[i, :n], whole_logits[i, :n], rtol=1e-4, atol=1e-4)
    for per_replica, whole in zip(jax.tree.leaves(stats), jax.tree.leaves(whole_stats)):
        np.testing.assert_allclose(per_replica[0], whole, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(per_replica[0], per_replica[1])


def _brute_force_conv(x, kernel, stride):
    """float64 "same" convolution by summing over every kernel position."""
    time_kernel, freq_kernel = kernel.shape[:2]
    padded = np.pad(np.float64(x), ((0, 0), (time_kernel // 2,) * 2, (freq_kernel // 2,) * 2, (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (time_kernel, freq_kernel), axis=(1, 2))
    windows = windows[:, :: stride[0], :: stride[1]]  # [B, T', F', C, time, freq]
    return np.einsum("btfcij,ijco->btfo", windows, np.float64(kernel))


@pytest.mark.parametrize("index, first_time_stride", [(0, 2), (0, 3), (1, 2), (2, 2)])
@pytest.mark.parametrize("conv", [conv_direct, conv_frames_as_channels], ids=["direct", "frames_as_channels"])
def test_both_convolution_forms_match_a_float64_brute_force(conv, index, first_time_stride):
    (freq_kernel, time_kernel), (freq_stride, time_stride) = tiny(
        conv_layers=3, conv_channels=(1, 1, 1), time_stride=first_time_stride
    ).conv_geometry(index)
    rng = np.random.default_rng(index)
    channels = 1 if index == 0 else 3
    x = rng.standard_normal((2, 13, 45, channels)).astype(np.float32)  # odd frames and bins
    kernel = rng.standard_normal((time_kernel, freq_kernel, channels, 4)).astype(np.float32)
    got = jax.jit(conv, static_argnums=2)(x, kernel, (time_stride, freq_stride))
    np.testing.assert_allclose(got, _brute_force_conv(x, kernel, (time_stride, freq_stride)), rtol=1e-4, atol=1e-3)


def _float64_recurrent_layer(config, params, x, lengths):
    """RecurrentLayer at inference (running statistics 0 and 1) as per-utterance loops in float64."""
    p = jax.tree.map(np.float64, params)
    norm = p["MaskedBatchNorm_0"]
    projected = x @ p["input_projection"]["kernel"]
    projected = projected * norm["scale"] / np.sqrt(1 + config.batch_norm_epsilon) + norm["bias"]
    directions = ["forward", "backward"] if config.bidirectional else ["forward"]
    gates = config.rnn_gates * config.rnn_hidden
    out = np.zeros(x.shape[:2] + (config.rnn_hidden,))
    for b, length in enumerate(lengths):
        for d, name in enumerate(directions):
            kernel = p[name]["recurrent_kernel"]
            bias = p[name].get("recurrent_bias", np.zeros(gates))
            h = np.zeros(config.rnn_hidden)
            frames = range(length) if name == "forward" else reversed(range(length))
            for t in frames:
                x_t, h_t = np.split(projected[b, t, d * gates : (d + 1) * gates], config.rnn_gates), h @ kernel + bias
                if config.rnn_cell == "gru":
                    x_r, x_z, x_n = x_t
                    h_r, h_z, h_n = np.split(h_t, 3)
                    reset, update = 1 / (1 + np.exp(-(x_r + h_r))), 1 / (1 + np.exp(-(x_z + h_z)))
                    h = (1 - update) * np.tanh(x_n + reset * h_n) + update * h
                else:
                    h = np.clip(x_t[0] + h_t, 0, config.relu_clip)
                out[b, t] += h
    return out


@pytest.mark.parametrize("cell", ["gru", "rnn"])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "forward"])
def test_recurrent_layer_matches_a_float64_loop_per_utterance(cell, bidirectional):
    config = tiny(rnn_cell=cell, bidirectional=bidirectional, rnn_hidden=6)
    rng = np.random.default_rng(7)
    lengths = [9, 4, 1, 0]
    x = rng.standard_normal((len(lengths), 9, 5)).astype(np.float32)
    mask = jnp.arange(9)[None, :] < jnp.asarray(lengths)[:, None]
    layer = RecurrentLayer(config)
    variables = layer.init(jax.random.key(0), x, mask, train=False)
    # Every parameter random, biases too, so a misplaced one cannot hide behind a zero.
    leaves, tree = jax.tree.flatten(variables["params"])
    params = jax.tree.unflatten(tree, [0.5 * rng.standard_normal(leaf.shape).astype(np.float32) for leaf in leaves])
    got = layer.apply({**variables, "params": params}, x, mask, train=False)
    np.testing.assert_allclose(got, _float64_recurrent_layer(config, params, x, lengths), rtol=1e-4, atol=1e-5)


def _hand_count_bidirectional_gru(channels, hidden, layers):
    bins = 81  # 161 bins, stride 2
    conv = 41 * 11 * 1 * channels + 2 * channels  # kernel + batch-norm scale/offset
    count, width = conv, bins * channels
    for _ in range(layers):
        count += width * 2 * 3 * hidden + 2 * (2 * 3 * hidden)  # projection for both directions + its batch norm
        count += 2 * (hidden * 3 * hidden + 3 * hidden)  # recurrent kernel and bias per direction
        width = hidden
    return count + hidden * 29 + 29


def _hand_count_lookahead_rnn(channels, hidden, layers, lookahead):
    bins = (81, 41, 21)
    kernels = ((41, 11), (21, 11), (21, 11))
    count, in_channels = 0, 1
    for (kf, kt), c in zip(kernels, channels):
        count += kf * kt * in_channels * c + 2 * c
        in_channels = c
    width = bins[len(channels) - 1] * channels[-1]
    for _ in range(layers):
        count += width * hidden + 2 * hidden + hidden * hidden  # projection, batch norm, recurrent kernel
        width = hidden
    return count + (lookahead + 1) * hidden + hidden * 29 + 29


def test_parameter_counts_match_hand_counts():
    gru = tiny(conv_channels=(5,), rnn_layers=3, rnn_hidden=12)
    assert count_params(gru) == _hand_count_bidirectional_gru(5, 12, 3)
    rnn = tiny(conv_layers=3, conv_channels=(2, 3, 4), rnn_cell="rnn", rnn_layers=2, bidirectional=False, lookahead=6)
    assert count_params(rnn) == _hand_count_lookahead_rnn((2, 3, 4), 8, 2, 6)
    assert count_params(load_config("configs/ds2_small.yaml").model) == _hand_count_bidirectional_gru_2conv(32, 32, 512, 3)


def _hand_count_bidirectional_gru_2conv(c0, c1, hidden, layers):
    convs = 41 * 11 * c0 + 2 * c0 + 21 * 11 * c0 * c1 + 2 * c1
    count, width = convs, 41 * c1
    for _ in range(layers):
        count += width * 6 * hidden + 12 * hidden + 2 * (3 * hidden * hidden + 3 * hidden)
        width = hidden
    return count + hidden * 29 + 29


def test_bfloat16_compute_keeps_float32_params_and_logits():
    config = tiny(dtype="bfloat16")
    variables = variables_of(ONE_CONV)  # compute dtype does not change the parameters
    shapes = jax.eval_shape(lambda: init_variables(config, jax.random.key(0)))
    assert {leaf.dtype for leaf in jax.tree.leaves(shapes["params"])} == {jnp.dtype(jnp.float32)}
    features, lengths = random_batch(np.random.default_rng(3), [23, 5])
    (logits, _), _ = run(config, features, lengths, train=True, variables=variables)
    (reference, _), _ = run(ONE_CONV, features, lengths, train=True)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, reference, atol=0.1)


def test_features_of_the_wrong_shape_are_rejected():
    with pytest.raises(ValueError, match=r"features must be \[batch, frames, 161\]"):
        DeepSpeech2(ONE_CONV).apply(variables_of(ONE_CONV), jnp.zeros((2, 10, 80)), jnp.array([10, 10]), train=False)


def model_section(values):
    return config_lib.section_from_dict(ModelConfig, values, "model")


def test_model_section_errors_name_the_key():
    with pytest.raises(config_lib.ConfigError, match="did you mean 'rnn_hidden'"):
        model_section({"rnn_hiden": 10})
    with pytest.raises(config_lib.ConfigError, match="conv_channels has 1 entries"):
        model_section({"conv_layers": 2, "conv_channels": [32]})
    with pytest.raises(config_lib.ConfigError, match="rnn_cell"):
        model_section({"rnn_cell": "lstm"})
    assert model_section({"conv_layers": 1, "conv_channels": [4]}).conv_channels == (4,)


def test_config_file_resolves_its_task(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("task: deepspeech2\nmodel:\n  rnn_hidden: 64\ntrain:\n  epochs: 3\n")
    config = load_config(path)
    assert config.model.rnn_hidden == 64 and config.train.epochs == 3 and config.task == "deepspeech2"
    (tmp_path / "untasked.yaml").write_text("model: {}\n")
    with pytest.raises(config_lib.ConfigError, match="needs a top-level `task: NAME`"):
        load_config(tmp_path / "untasked.yaml")
    (tmp_path / "other.yaml").write_text("task: wav2vec\n")
    with pytest.raises(config_lib.ConfigError, match=r"unknown task 'wav2vec': it is not registered \(registered tasks: deepspeech2 "):
        load_config(tmp_path / "other.yaml")


def test_gradients_are_finite_with_an_infeasible_utterance():
    config = ONE_CONV
    features, lengths = random_batch(np.random.default_rng(4), [23, 4, 15])
    labels = jnp.array([[1, 2, 3, 3, 4], [5, 6, 7, 8, 9], [9, 9, 0, 0, 0]])
    label_lengths = jnp.array([5, 5, 2])  # the second needs 5 frames but has ceil(4/2) = 2
    variables = variables_of(config)

    def loss_fn(params):
        (logits, out_lengths), _ = DeepSpeech2(config).apply(
            {**variables, "params": params}, features, lengths, train=True, mutable=["batch_stats"]
        )
        loss, feasible = ctc_loss(logits, out_lengths, labels, label_lengths)
        return loss.sum() / feasible.sum(), feasible

    (loss, feasible), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(variables["params"])
    np.testing.assert_array_equal(feasible, [True, False, True])
    assert np.isfinite(float(loss))
    leaves = jax.tree.leaves(grads)
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert all(np.abs(np.asarray(g)).max() > 0 for g in leaves)
