"""Correctness of both CUDA engines with k virtual ranks on one GPU (scripts/gpu_check.sh).

Each rank has its own stream and buffers and is entered from its own host
thread, as XLA enters the handler. Random inputs, outputs poisoned (NaN / -1)
before each call, float64 reference, replicas compared bitwise. Writes one
JSON line per case to --out and exits non-zero if any case fails.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python scripts/check_cuda_ring.py --out results.jsonl
"""

import argparse
import json
import os
import sys
import time

# k kernels that spin on each other from k streams need k hardware queues;
# CUDA reads this once, when it starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import ml_dtypes  # noqa: E402  (jax's dependency: numpy's bfloat16)
import numpy as np  # noqa: E402

from byte_sizes import parse_bytes  # noqa: E402
from jaxring.collectives import _jaxring_cuda_harness as harness  # noqa: E402
from jaxring.collectives import _ffi, _ring_call  # noqa: E402

MODES = _ffi.modes()
DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32),
}
# Unit roundoff of each output type; the sum is accumulated in float32.
ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11, "int32": 0.0}
ENGINES = (("host", "auto"), ("device", "auto"), ("device", "ring"), ("device", "one_shot"))


def sizes_for(k, largest):
    return sorted({s for s in (0, 1, k - 1, k + 1, 1000003, 64 << 20) if s <= largest})


def random_inputs(rng, dtype, k, n):
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=(k, n), dtype=np.int32)
    return rng.standard_normal((k, n), dtype=np.float32).astype(DTYPES[dtype])


class Reference:
    """Inputs and float64 results of one (k, size, dtype), shared by every mode and engine.

    Rank r's input is row r of `data` [k, padded size]: all-reduce takes the
    first `size` elements, reduce_scatter the padded row (the caller pads to
    whole chunks), all_gather the first chunk.
    """

    def __init__(self, rng, dtype, k, size):
        self.k, self.size, self.dtype = k, size, dtype
        self.padded = -(-size // k) * k
        self.chunk = self.padded // k
        self.data = random_inputs(rng, dtype, k, self.padded)
        wide = self.data.astype(np.float64)
        self.total = wide.sum(axis=0)
        self.magnitude = np.abs(wide).sum(axis=0)

    def inputs(self, mode):
        columns = {"allreduce": self.size, "reduce_scatter": self.padded, "all_gather": self.chunk}[mode]
        return np.ascontiguousarray(self.data[:, :columns])

    def expected(self, mode):
        """(expected [k, n], allowed error [k, n]) in float64."""
        k = self.k
        if mode == "all_gather":
            gathered = self.data[:, :self.chunk].astype(np.float64).reshape(-1)
            return np.broadcast_to(gathered, (k, self.padded)), np.zeros((k, self.padded))
        total, magnitude = self.total, self.magnitude
        if mode == "reduce_scatter":
            total, magnitude = total.reshape(k, self.chunk), magnitude.reshape(k, self.chunk)
        else:
            total = np.broadcast_to(total[:self.size], (k, self.size))
            magnitude = np.broadcast_to(magnitude[:self.size], (k, self.size))
        return total, ROUNDOFF[self.dtype] * np.abs(total) + k * 2.0**-24 * magnitude


def check_case(engine, path, mode, reference, timeout):
    """One call; returns (ok, message)."""
    k = reference.k
    inputs = reference.inputs(mode)
    full = reference.size if mode == "allreduce" else reference.padded
    expected, bound = reference.expected(mode)
    outputs = np.zeros(expected.shape, DTYPES[reference.dtype])
    # The harness copies bytes; nanobind accepts numpy's own dtypes only (not ml_dtypes' bfloat16).
    bits = np.dtype(f"u{outputs.itemsize}")
    errors = harness.run(engine, path, MODES[mode], reference.dtype, inputs.view(bits), outputs.view(bits), full,
                         _ring_call.SLICE_BYTES["cuda"], timeout)
    if any(errors):
        return False, "; ".join(e for e in errors if e)
    got = outputs.astype(np.float64)
    bad = ~(np.abs(got - expected) <= bound)  # NaN (poison left behind) counts as bad
    if bad.any():
        rank, index = np.argwhere(bad)[0]
        return False, (f"{int(bad.sum())} wrong elements; first: rank {rank} element {index} "
                       f"got {got[rank, index]!r} expected {expected[rank, index]!r}")
    if mode != "reduce_scatter":
        for r in range(1, k):
            if outputs[r].tobytes() != outputs[0].tobytes():
                return False, f"rank {r}'s replica differs bitwise from rank 0's"
    return True, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON lines, one per case")
    parser.add_argument("--ranks", default="2,3,4,5,6,7,8")
    parser.add_argument("--largest", type=parse_bytes, default=64 << 20, help="skip sizes above this many elements (K/M/G suffixes: 1M = 2**20)")
    parser.add_argument("--engines", default="host,device", help="which of host, device to check")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a call may wait for its ranks")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="which of " + ", ".join(DTYPES))
    parser.add_argument("--modes", default=",".join(MODES), help="which of " + ", ".join(MODES))
    parser.add_argument("--max-failures", type=int, default=0,
                        help="stop after this many failed cases (0: never); a hung engine costs --timeout per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtypes, modes = args.dtypes.split(","), args.modes.split(",")
    for name, chosen, known in (("--dtypes", dtypes, DTYPES), ("--modes", modes, MODES)):
        if unknown := [c for c in chosen if c not in known]:
            parser.error(f"{name}: unknown {unknown}; choose from {', '.join(known)}")
    rng = np.random.default_rng(args.seed)
    print("device:", harness.device_info(), flush=True)
    failures = cases = 0
    with open(args.out, "w") as out:
        for k in map(int, args.ranks.split(",")):
            for size in sizes_for(k, args.largest):
                for dtype in dtypes:
                    reference = Reference(rng, dtype, k, size)
                    for mode in modes:
                        for engine, path in ENGINES:
                            if engine not in args.engines.split(","):
                                continue
                            if path == "one_shot" and size > 1000003:
                                continue  # one-shot is for small buffers; 64M x k reads would only be slow
                            start = time.perf_counter()
                            ok, message = check_case(engine, path, mode, reference, args.timeout)
                            record = dict(engine=engine, path=path, mode=mode, dtype=dtype, ranks=k, size=size,
                                          ok=ok, message=message, seconds=round(time.perf_counter() - start, 3))
                            out.write(json.dumps(record) + "\n")
                            cases += 1
                            if not ok:
                                failures += 1
                                print("FAIL", record, flush=True)
                                if failures == args.max_failures:
                                    print(f"stopping after {failures} failed cases (--max-failures)")
                                    return 1
            print(f"k={k}: {cases} cases so far, {failures} failed", flush=True)
    print(f"{cases} cases, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
