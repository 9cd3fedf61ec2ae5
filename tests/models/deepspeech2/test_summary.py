"""Analytic FLOPs against XLA's cost analysis of the compiled forward; the summary script."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import models  # noqa: F401  (registers deepspeech2)
from jaxring.engine.experiment import load_config
from models.deepspeech2 import model
from models.deepspeech2.model import DeepSpeech2, ModelConfig, init_variables
from models.deepspeech2.summary import count_params, flops_per_audio_second, forward_flops


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(conv_layers=2, conv_channels=(4, 4), rnn_layers=2, rnn_hidden=96),
        ModelConfig(
            conv_layers=3, conv_channels=(4, 4, 8), rnn_cell="rnn", rnn_layers=2, rnn_hidden=96,
            bidirectional=False, lookahead=5,
        ),
        ModelConfig(conv_layers=1, conv_channels=(4,), rnn_layers=1, rnn_hidden=32, time_stride=3),
    ],
    ids=["gru-bidirectional", "rnn-lookahead", "time-stride-3"],
)
def test_forward_flops_match_xla_cost_analysis(config, monkeypatch):
    frames = 24
    # The analytic count is the 2-D convolution's; the CPU form also multiplies
    # the zero frames of its time padding.
    monkeypatch.setattr(model, "conv_frames_as_channels", model.conv_direct)
    variables = jax.eval_shape(lambda: init_variables(config, jax.random.key(0)))  # shapes are enough
    # XLA counts a loop body once, whatever its trip count: unroll the recurrence fully.
    config = ModelConfig(**{**config.__dict__, "scan_unroll": frames})
    features = jnp.zeros((1, frames, config.num_features))
    lengths = jnp.array([frames])
    forward = jax.jit(lambda v, x, n: DeepSpeech2(config).apply(v, x, n, train=False))
    # The HLO before optimisation: fusion makes XLA count the elementwise
    # producers of a sliced operand once per slice, inflating the count.
    xla_flops = forward.lower(variables, features, lengths).cost_analysis()["flops"]
    # The analytic count leaves out elementwise work (gates, batch norm, masks),
    # which XLA counts at about one FLOP per element.
    assert forward_flops(config, frames) == pytest.approx(xla_flops, rel=0.03)


def test_training_flops_per_second_are_three_forwards_of_one_more_second():
    config = ModelConfig(conv_layers=1, conv_channels=(4,), rnn_layers=1, rnn_hidden=16)
    one_more_second = forward_flops(config, 200) - forward_flops(config, 100)
    assert flops_per_audio_second(config, training=False) == one_more_second
    assert flops_per_audio_second(config) == 3 * one_more_second


def test_model_summary_script_prints_exact_params():
    out = subprocess.run(
        [sys.executable, "scripts/dev/model_summary.py", "--config", "configs/ds2_tiny.yaml"],
        capture_output=True, text=True, check=True, env={"PYTHONPATH": ".", "JAX_PLATFORMS": "cpu", "PATH": ""},
    ).stdout
    assert f"params: {count_params(load_config('configs/ds2_tiny.yaml').model)}\n" in out
    assert "GFLOPs per second of audio" in out
