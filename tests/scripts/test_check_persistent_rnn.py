"""scripts/gpu/check_persistent_rnn.py and scripts/bench/bench_torch_ds2.py on CPU: the parity check runs (the host
mirror in place of the kernels here), the targets come out of the records, the GPU image's missing audio packages are not needed,
and the PyTorch twin has the model's shapes."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import check_persistent_rnn as check  # noqa: E402
from tests.jaxring.rnn.mirrored_layer import stand_in_for_the_kernels  # noqa: E402


@pytest.mark.parametrize("cell, dtype", [("gru", "float32"), ("rnn", "bfloat16")])
def test_parity_case_holds_the_host_mirror_within_bounds_and_sees_no_kernel(monkeypatch, cell, dtype):
    stand_in_for_the_kernels(monkeypatch.setattr)
    record = check.parity_case(cell, 2, 3, 9, 5, dtype, seed=1)
    assert set(record["errors"]) == {"outputs", "d_kernels", "d_biases", "d_projected"}
    assert record["finite"] and all(record["errors"][n] <= record["bounds"][n] for n in record["errors"]), record
    # On a (faked) GPU a program without the kernel's custom call fails the case, however close its numbers.
    assert not record["kernel_called"] and not record["ok"], record


def test_targets_are_cudnns_step_over_the_persistent_one():
    def step(impl, dtype, batch, step_s, **extra):
        return dict(impl=impl, dtype=dtype, global_batch=batch, step_s=step_s, **extra)

    records = [step("persistent", "bfloat16", 64, 0.05, mfu=0.13), step("scan", "bfloat16", 64, 0.11),
               step("torch-cudnn", "bfloat16", 64, 0.125), step("persistent", "float32", 32, 0.1),
               dict(impl="torch-cudnn", dtype="float32", global_batch=32, error="torch is not installed here"),
               step("persistent", "bfloat16", 256, 0.2, compile_s=41.0)]
    targets = check.targets(records)
    assert targets["ds2_paper_bf16_b64_speedup_vs_cudnn>=2"] == pytest.approx(2.5)
    assert targets["ds2_paper_f32_b32_speedup_vs_cudnn>=1.5"] is None
    assert targets["ds2_paper_bf16_b256_speedup_vs_cudnn>=1.5"] is None
    assert targets["ds2_paper_bf16_b64_persistent_mfu>=0.12"] == 0.13
    assert targets["ds2_paper_b256_persistent_compile_s<=30"] == 41.0


_WITHOUT_AUDIO = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("soundfile", "soxr", "jiwer", "espeakng_loader", "ttspico", "tensorboardX"):
            raise ImportError("not installed: " + name)
sys.meta_path.insert(0, Block())
sys.path[:0] = ["scripts/gpu", "scripts/bench", "."]
import bench_torch_ds2, bench_train, check_persistent_rnn, compile_time, models
from jaxring.engine.experiment import build_task, load_config
task = build_task(load_config("configs/ds2_tiny.yaml", []))
print(sorted(task.init(__import__("jax").random.key(0))["params"])[:1])
"""


def test_the_gpu_stages_build_the_step_without_the_audio_packages():
    result = subprocess.run([sys.executable, "-c", _WITHOUT_AUDIO], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['conv0']"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_twin_has_the_models_frames_and_takes_a_step():
    import torch

    import models  # noqa: F401  (registers deepspeech2)
    from bench_torch_ds2 import bench_torch, build_model
    from bench_train import random_batch
    from jaxring.engine.experiment import load_config
    from models.deepspeech2.model import output_lengths

    config = load_config(ROOT / "configs" / "ds2_tiny.yaml", [], ROOT).model
    batch = random_batch(2, 0.5)
    logits = build_model(torch, config)(torch.from_numpy(batch["features"]).permute(0, 2, 1).unsqueeze(1))
    assert tuple(logits.shape) == (output_lengths(config, batch["features"].shape[1]), 2, 29)
    record = bench_torch(config, batch, "float32", steps=1, device="cpu")
    assert record["impl"] == "torch" and record["step_s"] > 0 and np.isfinite(record["last_loss"])


def test_a_failing_measurement_is_recorded_and_the_next_still_runs():
    written = []

    def fail():
        raise RuntimeError("cudaErrorCooperativeLaunchTooLarge")

    failed = check.measure(dict(case="a"), 30, fail, written.append)
    passed = check.measure(dict(case="b"), 30, lambda: dict(ok=True), written.append)
    assert written == [failed, passed]
    assert failed["ok"] is False and "cudaErrorCooperativeLaunchTooLarge" in failed["error"]
    assert passed["ok"] is True and passed["case"] == "b"


def test_a_hung_measurement_is_recorded_and_ends_the_process_in_its_limit():
    code = ("import json, sys, time; sys.path.insert(0, 'scripts/gpu'); import check_persistent_rnn as c; "
            "c.measure(dict(case='hangs'), 0.5, lambda: time.sleep(60), lambda r: print(json.dumps(r), flush=True))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert result.returncode == 3
    assert "no result in 0.5 s: hung" in result.stdout and '"case": "hangs"' in result.stdout


def test_a_step_record_comes_from_bench_train_as_it_is(monkeypatch):
    import jaxring

    monkeypatch.setattr(check, "CONFIG", "ds2_tiny")
    monkeypatch.setattr(check, "SECONDS", 0.5)
    monkeypatch.setattr(check, "TIMED_STEPS", 1)
    record = check.step_record("scan", "float32", 8, jaxring.init())  # the tests' 8 host devices
    assert (record["impl"], record["dtype"], record["global_batch"]) == ("scan", "float32", 8)
    assert record["step_s"] > 0 and record["compile_s"] > 0


def test_frozen_mask_gradients_are_the_scans_where_the_masks_agree():
    """The plain RNN's float64 gradient reference equals jax's gradients of the scan, given the scan's own outputs."""
    import jax
    import jax.numpy as jnp

    from jaxring.rnn.scan import scan_recurrence

    rng = np.random.default_rng(3)
    directions, batch, frames, hidden, clip = 2, 4, 11, 6, 2.0
    kernels = rng.normal(size=(directions, hidden, hidden)) / np.sqrt(hidden)
    biases = 0.1 * rng.normal(size=(directions, hidden))
    projected = 2 * rng.normal(size=(directions, batch, frames, hidden))
    lengths = np.array([frames, 3, 7, 1])
    forward = np.arange(frames)[None, :] < lengths[:, None]
    mask = np.stack([forward, forward[:, ::-1]])
    d_outputs = rng.normal(size=(directions, batch, frames, hidden))
    with jax.default_matmul_precision("highest"):
        outputs, vjp = jax.vjp(lambda k, b, p: scan_recurrence("rnn", clip, 1, k, b, p, jnp.asarray(mask)),
                               *(jnp.asarray(a, jnp.float32) for a in (kernels, biases, projected)))
        expected = vjp(jnp.asarray(d_outputs, jnp.float32))
    got = check.frozen_mask_gradients(kernels, outputs, mask, d_outputs, clip)
    assert 0 < np.mean((np.asarray(outputs) > 0) & (np.asarray(outputs) < clip)) < 1  # both clips are reached
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, np.asarray(e, np.float64), rtol=1e-4, atol=1e-4 * np.abs(e).max())
