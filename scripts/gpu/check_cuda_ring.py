"""Correctness of both CUDA engines with k virtual ranks on one GPU (scripts/gpu/gpu_check.sh).

Each rank has its own stream and buffers and is entered from its own host
thread, as XLA enters the handler. Random inputs, outputs poisoned (all bits
set) before each call, replicas compared bitwise. References: float sums
against float64 numpy within the accumulation's rounding; integer sums
exactly, wrapped as lax.psum wraps (inputs over the whole range); max and min
bit for bit against jax.lax.max / lax.min folded over the ranks in rank order
on this GPU (XLA's GPU rule: a NaN propagates, -0 is below +0), on inputs
with NaNs, infinities and signed zeros. A (dtype, reduction) the ring refuses
(max of complex, sum of bool) is only counted. Writes one JSON line per case
run to --out and exits non-zero if any case fails.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python scripts/gpu/check_cuda_ring.py --out results.jsonl
"""

import argparse
import functools
import json
import os
import sys
import time

# k kernels that spin on each other from k streams need k hardware queues;
# CUDA reads this once, when it starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
# jax computes the max/min references on the GPU; the harness allocates its own buffers beside it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import ml_dtypes  # noqa: E402  (jax's dependency: numpy's bfloat16)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # byte_sizes
from byte_sizes import parse_bytes  # noqa: E402
from jaxring.collectives import _jaxring_cuda_harness as harness  # noqa: E402
from jaxring.collectives import _ffi, _ring_call  # noqa: E402

MODES = _ffi.modes()
REDUCTIONS = tuple(_ffi.reductions())
DTYPES = {name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in _ffi.element_types()}
ENGINES = (("host", "auto"), ("device", "auto"), ("device", "ring"), ("device", "one_shot"))


def sizes_for(k, largest):
    return sorted({s for s in (0, 1, k - 1, k + 1, 4099, 1000003, 64 << 20) if s <= largest})


def is_float(dtype):
    return DTYPES[dtype].kind in "fcV"  # bfloat16 is ml_dtypes' "V"


def components(a):
    """A complex array as its float components (the engines' view of it); others as they are."""
    return a.view(a.real.dtype) if a.dtype.kind == "c" else a


def unit_roundoff(dtype):
    """Of the output's components, and of the accumulation (float32 below 32 bits)."""
    mantissa = ml_dtypes.finfo(components(np.zeros(1, DTYPES[dtype])).dtype).nmant
    accumulation = 52 if components(np.zeros(1, DTYPES[dtype])).dtype.itemsize == 8 else 23
    return 2.0 ** -(mantissa + 1), 2.0 ** -(accumulation + 1)


def random_inputs(rng, dtype, k, n, reduction):
    t = DTYPES[dtype]
    if dtype == "bool":
        return rng.integers(0, 2, size=(k, n)).astype(bool)
    if t.kind in "iu":  # the whole range: sums wrap
        info = np.iinfo(t)
        return rng.integers(info.min, info.max, size=(k, n), dtype=t, endpoint=True)
    wide = rng.standard_normal((k, 2 * n if t.kind == "c" else n))
    if reduction != "sum":  # where max and min rules differ: NaN, infinities, signed zeros, ties
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0])
        where = rng.random(wide.shape) < 0.2
        wide[where] = rng.choice(specials, size=int(where.sum()))
    parts = wide.astype(components(np.zeros(1, t)).dtype if t.kind == "c" else t)
    return parts.view(t) if t.kind == "c" else parts


@functools.cache
def _lax_pairwise(reduction):
    import jax

    return jax.jit(getattr(jax.lax, reduction))


def lax_fold(data, reduction):
    """lax.max / lax.min of the rows of `data` in rank order, on the default (GPU) device."""
    import jax

    op = _lax_pairwise(reduction)
    rows = data.view(np.uint8) if data.dtype == bool else data  # 0 and 1: the same max and min
    with jax.enable_x64(True):  # float64 and the 64-bit integers as they are
        running = jax.device_put(rows[0])
        for row in rows[1:]:
            running = op(running, jax.device_put(row))
        return np.asarray(running).view(data.dtype)


class Reference:
    """Inputs and results of one (k, size, dtype, reduction), shared by every mode and engine.

    Rank r's input is row r of `data` [k, padded size]: all-reduce takes the
    first `size` elements, reduce_scatter the padded row (the caller pads to
    whole chunks), all_gather the first chunk.
    """

    def __init__(self, rng, dtype, k, size, reduction):
        self.k, self.size, self.dtype, self.reduction = k, size, dtype, reduction
        self.padded = -(-size // k) * k
        self.chunk = self.padded // k
        self.data = random_inputs(rng, dtype, k, self.padded, reduction)
        self.bound = None
        if reduction != "sum":
            self.result = None  # lax's, computed on the first case the ring takes (it refuses complex ones)
        elif not is_float(dtype):
            self.result = self.data.sum(axis=0, dtype=self.data.dtype)  # wraps, as lax.psum
        else:
            wide = components(self.data).astype(np.float64)
            self.result = wide.sum(axis=0)
            output, accumulation = unit_roundoff(dtype)
            self.bound = output * np.abs(self.result) + k * accumulation * np.abs(wide).sum(axis=0)

    def inputs(self, mode):
        columns = {"allreduce": self.size, "reduce_scatter": self.padded, "all_gather": self.chunk}[mode]
        return np.ascontiguousarray(self.data[:, :columns])

    def expected(self, mode):
        """(expected [k, n] (float components of a float sum), allowed error or None: exact)."""
        k = self.k
        if mode == "all_gather":
            return np.broadcast_to(self.data[:, :self.chunk].reshape(-1), (k, self.padded)), None
        if self.result is None:
            self.result = lax_fold(self.data, self.reduction) if self.padded else self.data[0]
        per_element = components(np.zeros(1, DTYPES[self.dtype])).size if self.bound is not None else 1
        if mode == "reduce_scatter":
            shape = (k, self.chunk * per_element)
            return self.result.reshape(shape), None if self.bound is None else self.bound.reshape(shape)
        n = self.size * per_element
        bound = None if self.bound is None else np.broadcast_to(self.bound[:n], (k, n))
        return np.broadcast_to(self.result[:n], (k, n)), bound


def first_difference(got, expected, bound):
    """(count, index) of the elements that differ: beyond `bound` (NaN counts), else in their bits (any NaN
    matching a NaN); (0, None) if none."""
    if bound is not None:
        bad = ~(np.abs(got.astype(np.float64) - expected) <= bound)
    else:
        got_parts, expected_parts = components(got), components(np.ascontiguousarray(expected))
        bits = np.dtype(f"u{got_parts.itemsize}")
        bad = got_parts.view(bits) != expected_parts.view(bits)
        if got_parts.dtype.kind in "fV":
            nan = np.isnan(expected_parts.astype(np.float64))
            bad = np.where(nan, ~np.isnan(got_parts.astype(np.float64)), bad)
    if not bad.any():
        return 0, None
    return int(bad.sum()), tuple(np.argwhere(bad)[0])


def check_case(engine, path, mode, reference, timeout):
    """One call; returns (ok, message); ok is None where the ring refuses the case."""
    k = reference.k
    inputs = reference.inputs(mode)
    full = reference.size if mode == "allreduce" else reference.padded
    out_columns = reference.chunk if mode == "reduce_scatter" else full
    outputs = np.zeros((k, out_columns), DTYPES[reference.dtype])
    reduction = "sum" if mode == "all_gather" else reference.reduction
    try:
        # The harness copies bytes; nanobind takes numpy's own dtypes only (not bfloat16, not complex128).
        errors = harness.run(engine, path, MODES[mode], reference.dtype, inputs.view(np.uint8),
                             outputs.view(np.uint8), full, _ring_call.SLICE_BYTES["cuda"], timeout, reduction)
    except ValueError as refusal:
        return None, str(refusal)
    if any(errors):
        return False, "; ".join(e for e in errors if e)
    expected, bound = reference.expected(mode)
    got = components(outputs) if bound is not None else outputs
    count, where = first_difference(got, expected, bound)
    if count:
        return False, (f"{count} wrong elements; first: rank {where[0]} element {where[1]} "
                       f"got {got[where]!r} expected {expected[where]!r}")
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
    parser.add_argument("--reductions", default=",".join(REDUCTIONS), help="which of " + ", ".join(REDUCTIONS))
    parser.add_argument("--modes", default=",".join(MODES), help="which of " + ", ".join(MODES))
    parser.add_argument("--max-failures", type=int, default=0,
                        help="stop after this many failed cases (0: never); a hung engine costs --timeout per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtypes, reductions, modes = args.dtypes.split(","), args.reductions.split(","), args.modes.split(",")
    for name, chosen, known in (("--dtypes", dtypes, DTYPES), ("--reductions", reductions, REDUCTIONS),
                                ("--modes", modes, MODES)):
        if unknown := [c for c in chosen if c not in known]:
            parser.error(f"{name}: unknown {unknown}; choose from {', '.join(known)}")
    rng = np.random.default_rng(args.seed)
    print("device:", harness.device_info(), flush=True)
    failures = cases = refused = 0
    with open(args.out, "w") as out:
        for k in map(int, args.ranks.split(",")):
            for size in sizes_for(k, args.largest):
                for dtype in dtypes:
                    for reduction in reductions:
                        reference = Reference(rng, dtype, k, size, reduction)
                        for mode in modes:
                            if mode == "all_gather" and reduction != reductions[0]:
                                continue  # gathers reduce nothing: once per dtype
                            for engine, path in ENGINES:
                                if engine not in args.engines.split(","):
                                    continue
                                if path == "one_shot" and size > 1000003:
                                    continue  # one-shot is for small buffers; 64M x k reads would only be slow
                                start = time.perf_counter()
                                ok, message = check_case(engine, path, mode, reference, args.timeout)
                                if ok is None:
                                    refused += 1
                                    continue
                                record = dict(engine=engine, path=path, mode=mode, dtype=dtype,
                                              reduction=reduction, ranks=k, size=size, ok=ok, message=message,
                                              seconds=round(time.perf_counter() - start, 3))
                                out.write(json.dumps(record) + "\n")
                                cases += 1
                                if not ok:
                                    failures += 1
                                    print("FAIL", record, flush=True)
                                    if failures == args.max_failures:
                                        print(f"stopping after {failures} failed cases (--max-failures)")
                                        return 1
            print(f"k={k}: {cases} cases so far, {failures} failed", flush=True)
    print(f"{cases} cases, {failures} failed ({refused} refused by the ring, as it should)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
