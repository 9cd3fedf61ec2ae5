"""Both CUDA engines with steps queued as JAX queues them (scripts/gpu_check.sh part 1).

k virtual ranks on one GPU (the harness of scripts/check_cuda_ring.py): each
rank's thread enqueues every step's collective (all-reduce at each --sizes,
reduce_scatter and all_gather at the first) on its stream without waiting
for any, each step an XLA execution of its own (its own run id and buffers)
with inputs of its own; one synchronisation at the end, then every step's
output is checked against float64 numpy and its replicas compared bitwise. A
stall fails within --timeout (the device kernels and the host meetings both
give up then). One JSON line per case to --out; exit status non-zero if any
case fails.

    python scripts/check_cuda_queued.py --out queued.jsonl --steps 256 --ranks 2,8
"""

import argparse
import json
import sys
import time

import numpy as np

from check_cuda_ring import ENGINES, MODES, _ring_call, harness


def check_queued(rng, engine, path, k, steps, n, timeout, mode="allreduce"):
    """(ok, message) of `steps` queued float32 collectives over k ranks of a full buffer of n
    elements (a multiple of k for reduce_scatter and all_gather)."""
    chunk = n // k
    x = rng.standard_normal((steps, k, chunk if mode == "all_gather" else n), dtype=np.float32)
    out = np.zeros((steps, k, chunk if mode == "reduce_scatter" else n), np.float32)
    errors = harness.queue(engine, path, MODES[mode], "float32", x, out, n, _ring_call.SLICE_BYTES["cuda"], timeout)
    if any(errors):
        return False, "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)
    wide = x.astype(np.float64)
    if mode == "all_gather":
        expected, bound = np.broadcast_to(wide.reshape(steps, 1, n), out.shape), np.zeros(out.shape)
    else:
        total = wide.sum(axis=1, keepdims=True)
        bound = 2.0**-24 * np.abs(total) + k * 2.0**-24 * np.abs(wide).sum(axis=1, keepdims=True)
        expected = total
        if mode == "reduce_scatter":  # rank r holds chunk r of the sum
            expected, bound = expected.reshape(steps, k, chunk), bound.reshape(steps, k, chunk)
    bad = ~(np.abs(out - expected) <= bound)  # NaN (a poisoned output) counts as bad
    if bad.any():
        step, rank, index = np.argwhere(bad)[0]
        return False, (f"{int(bad.sum())} wrong elements in {len(np.unique(np.argwhere(bad)[:, 0]))} steps; first: "
                       f"step {step} rank {rank} element {index} got {out[step, rank, index]!r} "
                       f"expected {np.broadcast_to(expected, out.shape)[step, rank, index]!r}")
    if mode != "reduce_scatter" and (out != out[:, :1]).any():
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
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("device:", harness.device_info(), flush=True)
    failures = cases = 0
    with open(args.out, "w") as out:
        for k in map(int, args.ranks.split(",")):
            sizes = [int(n) for n in args.sizes.split(",")]
            first = -(-sizes[0] // k) * k
            cases_of_k = [("allreduce", n) for n in sizes] + [("reduce_scatter", first), ("all_gather", first)]
            for mode, n in cases_of_k:
                for engine, path in ENGINES:
                    if engine not in args.engines.split(","):
                        continue
                    start = time.perf_counter()
                    ok, message = check_queued(rng, engine, path, k, args.steps, n, args.timeout, mode)
                    record = dict(engine=engine, path=path, mode=mode, ranks=k, size=n, steps=args.steps, ok=ok,
                                  message=message, seconds=round(time.perf_counter() - start, 3))
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
