"""Both CUDA engines with steps queued as JAX queues them (scripts/gpu/gpu_check.sh part 1).

k virtual ranks on one GPU (the harness of scripts/gpu/check_cuda_ring.py): each
rank's thread enqueues every step's collective (all-reduce at each --sizes,
reduce_scatter and all_gather at the first) on its stream without waiting
for any, each step an XLA execution of its own (its own run id and buffers)
with inputs of its own; one synchronisation at the end, then every step's
output is checked (float sums against float64 numpy, integer sums, max and
min exactly) and its replicas compared bitwise. float32 sums at every size
and mode; the --types (dtype:reduction) at the first size's all-reduce: each
type's own kernels, queued (their arithmetic in full: check_cuda_ring.py). A stall fails within --timeout (the device kernels and
the host meetings both give up then). One JSON line per case to --out; exit
status non-zero if any case fails.

    python scripts/gpu/check_cuda_queued.py --out queued.jsonl --steps 256 --ranks 2,8
"""

import argparse
import json
import sys
import time

import numpy as np

from check_cuda_ring import (DTYPES, ENGINES, MODES, _ring_call, components, harness, is_float, random_inputs,
                             unit_roundoff)

# Beyond float32's sum: a wrapping integer sum, the other float widths, max and min of signed and
# unsigned integers, a complex sum.
MORE_TYPES = "int8:sum,float64:max,bfloat16:min,complex64:sum,uint64:min"


def reference(x, dtype, reduction, k):
    """(expected [steps, 1, n] in float64 or the dtype, allowed error or None: exact) of finite inputs."""
    if reduction != "sum":
        wide = x.astype(np.float64) if is_float(dtype) else x
        return getattr(wide, reduction)(axis=1, keepdims=True), None
    if not is_float(dtype):
        return x.sum(axis=1, keepdims=True, dtype=x.dtype), None  # wraps, as lax.psum
    wide = components(x).astype(np.float64)
    total = wide.sum(axis=1, keepdims=True)
    output, accumulation = unit_roundoff(dtype)
    return total, output * np.abs(total) + k * accumulation * np.abs(wide).sum(axis=1, keepdims=True)


def check_queued(rng, engine, path, k, steps, n, timeout, mode="allreduce", dtype="float32", reduction="sum"):
    """(ok, message) of `steps` queued collectives over k ranks of a full buffer of n
    elements (a multiple of k for reduce_scatter and all_gather)."""
    chunk = n // k
    # Finite inputs (random_inputs' sum ones), so numpy's max and min are lax's.
    x = random_inputs(rng, dtype, steps * k, chunk if mode == "all_gather" else n, "sum").reshape(steps, k, -1)
    out = np.zeros((steps, k, chunk if mode == "reduce_scatter" else n), DTYPES[dtype])
    errors = harness.queue(engine, path, MODES[mode], dtype, x.view(np.uint8), out.view(np.uint8), n,
                           _ring_call.SLICE_BYTES["cuda"], timeout, "sum" if mode == "all_gather" else reduction)
    if any(errors):
        return False, "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)
    if mode == "all_gather":
        expected, bound = np.broadcast_to(x.reshape(steps, 1, n), out.shape), None
    else:
        expected, bound = reference(x, dtype, reduction, k)
        if mode == "reduce_scatter":  # rank r holds chunk r of the result
            expected = expected.reshape(steps, k, -1)
            bound = None if bound is None else bound.reshape(steps, k, -1)
    got = components(out) if bound is not None else out
    if bound is None:
        bad = got != expected if not is_float(dtype) else got.astype(np.float64) != expected.astype(np.float64)
    else:
        bad = ~(np.abs(got.astype(np.float64) - expected) <= bound)  # NaN (a poisoned output) counts as bad
    if bad.any():
        step, rank, index = np.argwhere(bad)[0]
        return False, (f"{int(bad.sum())} wrong elements in {len(np.unique(np.argwhere(bad)[:, 0]))} steps; first: "
                       f"step {step} rank {rank} element {index} got {got[step, rank, index]!r} "
                       f"expected {np.broadcast_to(expected, got.shape)[step, rank, index]!r}")
    if mode != "reduce_scatter" and (out.view(np.uint8) != out[:, :1].view(np.uint8)).any():
        return False, "the replicas of a step differ bitwise"
    return True, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON lines, one per case")
    parser.add_argument("--ranks", default="2,8")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--sizes", default="4099,30011",
                        help="all-reduce elements per step (odd: pieces of every length); reduce_scatter and "
                             "all_gather take the first, rounded up to whole chunks")
    parser.add_argument("--engines", default="host,device", help="which of host, device to check")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a call may wait for its ranks")
    parser.add_argument("--types", default=MORE_TYPES, help="dtype:reduction pairs beyond float32:sum ('' for none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("device:", harness.device_info(), flush=True)
    failures = cases = 0
    with open(args.out, "w") as out:
        for k in map(int, args.ranks.split(",")):
            sizes = [int(n) for n in args.sizes.split(",")]
            first = -(-sizes[0] // k) * k
            cases_of_k = [("allreduce", n, "float32", "sum") for n in sizes]
            cases_of_k += [("reduce_scatter", first, "float32", "sum"), ("all_gather", first, "float32", "sum")]
            for pair in filter(None, args.types.split(",")):
                dtype, reduction = pair.split(":")
                cases_of_k.append(("allreduce", sizes[0], dtype, reduction))
            for mode, n, dtype, reduction in cases_of_k:
                for engine, path in ENGINES:
                    if engine not in args.engines.split(","):
                        continue
                    start = time.perf_counter()
                    ok, message = check_queued(rng, engine, path, k, args.steps, n, args.timeout, mode, dtype,
                                               reduction)
                    record = dict(engine=engine, path=path, mode=mode, dtype=dtype, reduction=reduction, ranks=k,
                                  size=n, steps=args.steps, ok=ok, message=message,
                                  seconds=round(time.perf_counter() - start, 3))
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    cases += 1
                    if not ok:
                        failures += 1
                        print("FAIL", record, flush=True)
    print(f"{cases} cases of {args.steps} queued steps, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
