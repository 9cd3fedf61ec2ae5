"""Forward + backward time of Deep Speech 2 per second of audio, on this machine's default device.

    python scripts/bench/bench_model.py [--config configs/ds2_tiny.yaml ...] [--json OUT]
"""

import argparse
import json
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # models/ lives in the checkout, not the wheel

import models  # noqa: E402,F401  (registers deepspeech2)
from jaxring.engine.experiment import load_config  # noqa: E402
from models.deepspeech2 import alphabet  # noqa: E402
from models.deepspeech2.ctc import ctc_loss  # noqa: E402
from models.deepspeech2.model import FRAMES_PER_SECOND, DeepSpeech2, ModelConfig, init_variables, output_lengths  # noqa: E402
from models.deepspeech2.summary import count_params, flops_per_audio_second  # noqa: E402
from jaxring.engine.timing import median_seconds  # noqa: E402


def make_step(config: ModelConfig):
    model = DeepSpeech2(config)

    def loss_fn(params, batch_stats, features, lengths, labels, label_lengths):
        (logits, out_lengths), updates = model.apply(
            {"params": params, "batch_stats": batch_stats}, features, lengths, train=True, mutable=["batch_stats"]
        )
        loss, feasible = ctc_loss(logits, out_lengths, labels, label_lengths)
        return loss.sum() / jnp.maximum(feasible.sum(), 1), updates["batch_stats"]

    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


def bench(config: ModelConfig, batch: int, seconds: float, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    frames = int(seconds * FRAMES_PER_SECOND)
    features = jnp.asarray(rng.standard_normal((batch, frames, config.num_features)), jnp.float32)
    lengths = jnp.full((batch,), frames, jnp.int32)
    label_length = int(output_lengths(config, frames)) // 3
    labels = jnp.asarray(rng.integers(1, alphabet.SIZE, (batch, label_length)), jnp.int32)
    label_lengths = jnp.full((batch,), label_length, jnp.int32)
    variables = init_variables(config, jax.random.key(0))
    step = make_step(config)
    args = (variables["params"], variables["batch_stats"], features, lengths, labels, label_lengths)
    median = median_seconds(lambda: step(*args), repeats)  # after one call that compiles
    audio_seconds = batch * seconds
    return {
        "params": count_params(config),
        "dtype": config.dtype,
        "batch": batch,
        "utterance_s": seconds,
        "median_step_s": median,
        "s_per_audio_s": median / audio_seconds,
        "audio_s_per_s": audio_seconds / median,
        "gflops_per_s": flops_per_audio_second(config) * audio_seconds / median / 1e9,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs="+", type=Path,
                        default=[ROOT / "configs" / f"{name}.yaml" for name in ("ds2_tiny", "ds2_small")])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each utterance")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="override model.dtype")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args()

    records = []
    print(f"{'config':28} {'params':>11} {'dtype':>8} {'batch':>5} {'step s':>8} {'s/audio s':>10} {'audio s/s':>10} {'GFLOP/s':>8}")
    for path in args.config:
        config = load_config(path, paths_relative_to=ROOT).model
        if args.dtype:
            config = ModelConfig(**{**config.__dict__, "dtype": args.dtype})
        record = {"config": path.stem, **bench(config, args.batch, args.seconds, args.repeats)}
        record.update(device=str(jax.devices()[0]), machine=platform.machine(), cpus=jax.device_count())
        records.append(record)
        print(
            f"{record['config']:28} {record['params']:>11,} {record['dtype']:>8} {record['batch']:>5} {record['median_step_s']:>8.3f} "
            f"{record['s_per_audio_s']:>10.4f} {record['audio_s_per_s']:>10.1f} {record['gflops_per_s']:>8.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
