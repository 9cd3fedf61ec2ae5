"""The persistent recurrent layer judged in one GPU run: against the scan, then ds2_paper's step against cuDNN's GRU.

    python scripts/gpu/check_persistent_rnn.py --out gpu-results --part parity --name persistent-rnn-parity
    python scripts/gpu/check_persistent_rnn.py --out gpu-results --part steps --name persistent-rnn

1. Parity, OUT/NAME.jsonl (one line a case, `ok`, written as each ends): the
   persistent layer's CUDA kernel against the reference scan (jaxring/rnn/scan.py),
   outputs and the gradients of kernels, biases and inputs, float32 and bfloat16,
   GRU and plain RNN, odd hidden sizes, ragged lengths. The reference is the
   full-float32 scan on the same (rounded) inputs; the plain RNN's float32
   gradients are instead those of its own forward pass in float64 (the clipped
   ReLU's derivative jumps, so a TF32 scan's gradients differ from the float32
   scan's by 0.6-1.0 of the largest). float32 must match to FLOAT32_TOLERANCE of
   the largest value, bfloat16 be no further than twice the bfloat16 scan is.
2. Steps, OUT/NAME/gpu-persistent-rnn.json (rewritten after every measurement,
   so a timeout keeps what was done): ds2_paper's training step by
   scripts/bench/bench_train.py with model.rnn_impl=persistent and =scan, and the
   PyTorch twin with cuDNN's GRU (scripts/bench/bench_torch_ds2.py) where torch
   imports, at bfloat16 batch 64, float32 batch 32, bfloat16 batch 256, 4 s
   utterances; each record's compile_s is its first step, compile included.
   Its `targets` are docs/PERSISTENT_RNN.md's, judged by scripts/gpu/gpu_check_summary.py.
"""

import argparse
import functools
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))  # bench_train, bench_torch_ds2

# cell, directions, batch, frames, hidden: ds2_paper's layer (620 units) at batch 64 and 32,
# odd hidden sizes and batches, one direction, the plain RNN's clip.
PARITY_CASES = [
    ("gru", 2, 3, 17, 7),
    ("gru", 2, 64, 40, 620),
    ("gru", 2, 1, 33, 129),
    ("gru", 1, 256, 12, 333),
    ("rnn", 1, 5, 29, 33),
    ("rnn", 2, 32, 21, 620),
]
PARITY_DTYPES = ("float32", "bfloat16")
# Of the reference's largest value: the float32 kernel multiplies in TF32 (10-bit mantissa, as
# XLA's and cuDNN's float32 defaults on these GPUs do) against a full-float32 reference.
FLOAT32_TOLERANCE = 5e-3
BFLOAT16_SCAN_FACTOR = 2  # the bfloat16 kernel may be this many times further from float32 than the bfloat16 scan
BFLOAT16_FLOOR = 1e-2     # ... or this far, where the scan happens to land very close
# A parity case (its compiles included, the first one JAX's start on the GPU too) taking longer has
# hung: the stage then ends in this time instead of its whole limit.
CASE_TIMEOUT_S = 45
# One step measurement: batch 256's scan compiled in 111 s on an H100 (docs/PERSISTENT_RNN.md).
STEP_TIMEOUT_S = 200
# (dtype, global batch), the table, the decisive one first; each timed with every implementation.
STEP_CASES = [("bfloat16", 64), ("float32", 32), ("bfloat16", 256)]
IMPLS = ("persistent", "scan", "torch")
# Dense bfloat16 peak of one H100 or H200 (scripts/bench/bench_train.py's --peak-tflops), for the MFU target.
BF16_PEAK_TFLOPS = 989
CONFIG = "ds2_paper"
SECONDS = 4.0
TIMED_STEPS = 10  # per measurement, the median reported


def parity_case(cell, directions, batch, frames, hidden, dtype_name, seed) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxring.rnn import layer
    from jaxring.rnn.scan import scan_recurrence

    relu_clip = 20.0
    rng = np.random.default_rng(seed)
    width = layer.GATES[cell] * hidden
    kernels = rng.normal(size=(directions, hidden, width)) / np.sqrt(hidden)
    biases = 0.1 * rng.normal(size=(directions, width))
    projected = (3 if cell == "rnn" else 1) * rng.normal(size=(directions, batch, frames, width))
    lengths = rng.integers(1, frames + 1, size=batch)
    lengths[0] = frames
    forward_mask = np.arange(frames)[None, :] < lengths[:, None]
    # The backward direction reads time reversed: its padding comes first.
    mask = jnp.asarray(np.stack([forward_mask, forward_mask[:, ::-1]][:directions]))
    d_outputs = rng.normal(size=(directions, batch, frames, hidden))
    dtype = jnp.dtype(dtype_name)

    def scan(k, b, p):
        return scan_recurrence(cell, relu_clip, 1, k, b, p, mask)

    def persistent(k, b, p):
        return layer.persistent_recurrence(cell, relu_clip, k, b, p, mask)

    def values_and_gradients(fn, as_dtype):
        args = [jnp.asarray(a, dtype).astype(as_dtype) for a in (kernels, biases, projected)]

        @jax.jit
        def run(args, d_outputs):
            outputs, vjp = jax.vjp(fn, *args)
            return (outputs, *vjp(d_outputs))

        return [np.asarray(x, np.float32) for x in run(args, jnp.asarray(d_outputs, dtype).astype(as_dtype))]

    chosen, why = layer.choose("persistent", cell, jnp.zeros((directions, hidden, width), dtype),
                               jnp.zeros((directions, batch, frames, width), dtype))
    record = dict(case=f"{cell} D={directions} B={batch} T={frames} H={hidden}", dtype=dtype_name)
    if not chosen:
        return dict(record, ok=False, error=f"the persistent layer was not chosen: {why}")
    lowered = jax.jit(persistent).lower(*(jnp.asarray(a, dtype) for a in (kernels, biases, projected))).as_text()
    # Whether the program calls the kernel: a test puts the host mirror in its place
    # (tests/scripts/test_check_persistent_rnn.py).
    on_cuda = layer.platform() == "cuda"
    record["kernel_called"] = on_cuda and layer.cuda_module().FORWARD_TARGET in lowered
    with jax.default_matmul_precision("highest"):  # full float32, not the GPU's TF32 default
        reference = values_and_gradients(scan, jnp.float32)
    got = values_and_gradients(persistent, dtype)
    names = ("outputs", "d_kernels", "d_biases", "d_projected")
    scale = [float(np.abs(r).max()) or 1.0 for r in reference]

    def distances(result):
        """Of `result` from the reference, by the largest reference value. The clipped ReLU's derivative
        jumps at 0 and at the clip, so the plain RNN's float32 gradients are compared with those of the
        result's own forward pass (frozen_mask_gradients): any other rounding flips some elements.
        bfloat16 outputs cannot tell a value just below the clip from the clip (the spacing at 20 is
        0.125), so there the bfloat16 scan's distance bounds the kernel's."""
        expected = reference
        if cell == "rnn" and dtype_name == "float32":
            expected = [reference[0], *frozen_mask_gradients(kernels, result[0], mask, d_outputs, relu_clip)]
        return {n: float(np.abs(g - r).max()) / s for n, g, r, s in zip(names, result, expected, scale)}

    errors = distances(got)
    if dtype_name == "float32":
        bounds = {n: FLOAT32_TOLERANCE for n in names}
    else:
        scan_errors = distances(values_and_gradients(scan, dtype))
        record["scan_errors"] = scan_errors
        bounds = {n: max(BFLOAT16_SCAN_FACTOR * scan_errors[n], BFLOAT16_FLOOR) for n in names}
    finite = all(np.isfinite(g).all() for g in got)
    ok = finite and record["kernel_called"] == on_cuda and all(errors[n] <= bounds[n] for n in names)
    return dict(record, errors=errors, bounds=bounds, finite=finite, ok=bool(ok))


def frozen_mask_gradients(kernels, outputs, mask, d_outputs, relu_clip):
    """(d_kernels, d_biases, d_projected) of the clipped-ReLU recurrence in float64, its derivative (1
    inside (0, clip), else 0) read from `outputs`, the layer's own [D, B, T, H] result: as
    scan_recurrence defines the layer, state held across padded frames."""
    outputs = np.asarray(outputs, np.float64)
    kernels, d_outputs = np.asarray(kernels, np.float64), np.asarray(d_outputs, np.float64)
    real = np.asarray(mask)[..., None]
    active = real & (outputs > 0) & (outputs < relu_clip)
    state = np.zeros_like(outputs)  # what frame t reads: the output of the last real frame before it
    for t in range(1, outputs.shape[2]):
        state[:, :, t] = np.where(real[:, :, t - 1], outputs[:, :, t - 1], state[:, :, t - 1])
    d_pre = np.zeros_like(outputs)
    d_state = np.zeros_like(outputs[:, :, 0])  # of the state the next frame read
    for t in reversed(range(outputs.shape[2])):
        d_pre[:, :, t] = np.where(active[:, :, t], d_outputs[:, :, t] + d_state, 0)
        d_state = np.where(real[:, :, t], np.einsum("dbk,dhk->dbh", d_pre[:, :, t], kernels), d_state)
    return np.einsum("dbth,dbtk->dhk", state, d_pre), d_pre.sum(axis=(1, 2)), d_pre


def measure(base: dict, limit_s: float, run, write) -> dict:
    """`base` updated with run()'s record, or with the error it raised, and its seconds; handed to `write`.

    With no result in `limit_s`, writes `base` with that error and leaves the process: a kernel
    that never returns (a grid barrier that never opens) holds it, and the stage's time with it."""
    def hung():
        write(dict(base, ok=False, error=f"no result in {limit_s} s: hung (a grid barrier that never opens?)"))
        os._exit(3)

    watchdog = threading.Timer(limit_s, hung)
    watchdog.start()
    start = time.perf_counter()
    try:
        record = {**base, **run()}
    except Exception:  # noqa: BLE001  (a failure is recorded, the other measurements still run)
        record = dict(base, ok=False, error=traceback.format_exc(limit=4))
    finally:
        watchdog.cancel()
    record["seconds"] = time.perf_counter() - start
    write(record)
    return record


def run_parity(path: Path) -> None:
    with path.open("w") as out:
        def write(record):
            print(json.dumps(record), flush=True)
            out.write(json.dumps(record) + "\n")
            out.flush()

        for seed, (cell, directions, batch, frames, hidden) in enumerate(PARITY_CASES):
            for dtype in PARITY_DTYPES:
                base = dict(case=f"{cell} D={directions} B={batch} T={frames} H={hidden}", dtype=dtype)
                measure(base, CASE_TIMEOUT_S,
                        functools.partial(parity_case, cell, directions, batch, frames, hidden, dtype, seed), write)


def step_record(impl: str, dtype: str, batch_size: int, world) -> dict:
    import models  # noqa: F401  (registers deepspeech2)
    from bench_train import bench, random_batch
    from bench_torch_ds2 import bench_torch

    from jaxring.engine.experiment import load_config

    if impl == "torch":
        config = load_config(ROOT / "configs" / f"{CONFIG}.yaml", [f"model.dtype={dtype}"], ROOT)
        return bench_torch(config.model, random_batch(batch_size, SECONDS), dtype, steps=TIMED_STEPS)
    # bench_train.py's command line, as bench() reads it.
    args = argparse.Namespace(batch_size=batch_size, seconds=SECONDS, steps=TIMED_STEPS, loop_steps=0,
                              overrides=[f"model.dtype={dtype}", f"model.rnn_impl={impl}"],
                              peak_tflops=BF16_PEAK_TFLOPS if dtype == "bfloat16" else None)
    return {"impl": impl, "dtype": dtype, **bench(CONFIG, "ring", args, world)}


def targets(records: list[dict]) -> dict:
    """docs/PERSISTENT_RNN.md's targets from the records so far (None where a record is missing)."""
    def step(impl, dtype, batch):
        found = [r for r in records if (r.get("impl"), r.get("dtype"), r.get("global_batch")) == (impl, dtype, batch)
                 and "step_s" in r]
        return found[0] if found else None

    def speedup(dtype, batch):
        mine, theirs = step("persistent", dtype, batch), step("torch-cudnn", dtype, batch)
        return theirs["step_s"] / mine["step_s"] if mine and theirs else None

    b64, b256 = step("persistent", "bfloat16", 64), step("persistent", "bfloat16", 256)
    return {
        "ds2_paper_bf16_b64_speedup_vs_cudnn>=2": speedup("bfloat16", 64),
        "ds2_paper_f32_b32_speedup_vs_cudnn>=1.5": speedup("float32", 32),
        "ds2_paper_bf16_b256_speedup_vs_cudnn>=1.5": speedup("bfloat16", 256),
        "ds2_paper_bf16_b64_persistent_mfu>=0.12": b64.get("mfu") if b64 else None,
        "ds2_paper_b256_persistent_compile_s<=30": b256["compile_s"] if b256 else None,
    }


def run_steps(path: Path) -> None:
    import jax

    import jaxring

    world = jaxring.init()
    has_torch = importlib.util.find_spec("torch") is not None
    records = []

    def write(record):
        print(json.dumps(record), flush=True)
        path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d", time.gmtime()),
                                    "device": str(jax.devices()[0].device_kind), "config": CONFIG,
                                    "seconds": SECONDS, "records": [*records, record],
                                    "targets": targets([*records, record])}, indent=1))

    for dtype, batch_size in STEP_CASES:
        for impl in IMPLS:
            if impl == "torch" and not has_torch:
                records.append(dict(impl="torch-cudnn", dtype=dtype, global_batch=batch_size,
                                    error="torch is not installed here"))
                continue
            base = dict(impl=impl, dtype=dtype, global_batch=batch_size)
            run = functools.partial(step_record, impl, dtype, batch_size, world)
            records.append(measure(base, STEP_TIMEOUT_S, run, write))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder: NAME.jsonl and NAME/gpu-persistent-rnn.json")
    parser.add_argument("--part", choices=["parity", "steps"], required=True,
                        help="parity: the kernel against the scan; steps: the step times (gpu_check.sh runs "
                             "them as two stages, so a hung kernel costs the short one's limit)")
    parser.add_argument("--name", default="persistent-rnn")
    args = parser.parse_args()
    if args.part == "steps":
        (args.out / args.name).mkdir(parents=True, exist_ok=True)
        run_steps(args.out / args.name / "gpu-persistent-rnn.json")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.jsonl"
    run_parity(path)
    cases = [json.loads(line) for line in path.read_text().splitlines()]
    sys.exit(0 if cases and all(c["ok"] for c in cases) else 1)


if __name__ == "__main__":
    main()
