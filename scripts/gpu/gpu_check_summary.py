"""summary.json of one part of scripts/gpu/gpu_check.sh: every target, measured value, pass or fail.

Reads what the part's stages left in OUT (stages.jsonl, the harness's JSON
lines, the benchmark's JSON) and names every target of both parts: the ones
the other part measures say so. Then, per setting that waits on the GPU
(default engine, one-shot threshold, GPU bucket size), whether its
conditions passed and what to change where. Exits 1 if a target of this
part missed or was not measured.

    python scripts/gpu/gpu_check_summary.py gpu-results --part 1
"""

import argparse
import glob
import json
import os
import re
import sys

# (name, part, source): a harness file (all cases pass), a stage (it passed) or a
# benchmark target (bench_cuda_ring.py's `targets`, "<name><op><threshold>").
TARGETS = [
    ("smoke: both engines, k=2 and 8, tiny sizes", 1, ("cases", "smoke")),
    ("correctness: k=2,3,5,8, sizes to 1M, sums of float32, bfloat16, float16 and int32, all modes", 1, ("cases", "correctness")),
    ("correctness: k=2,8, every dtype by sum, max and min, sizes to 4099", 1, ("cases", "correctness-types")),
    ("4KiB_f32_k8_device_us<=40", 3, ("bench", "bench-decisive")),
    ("4KiB_f32_k2_device_us<=20", 3, ("bench", "bench-decisive")),
    ("4KiB_f32_k8_host_speedup>=8", 3, ("bench", "bench-decisive")),
    ("256MiB_f32_k8_copy_fraction>=0.85", 3, ("bench", "bench-decisive")),
    ("256MiB_bf16_k8_copy_fraction>=0.80", 3, ("bench", "bench-decisive")),
    ("500 queued steps through the MPI leg's CUDA handler", 1, ("stage", "mpi-cuda-queued")),
    ("256 queued steps through both CUDA engines, k=2 and 8", 1, ("cases", "cuda-queued")),
    ("persistent RNN kernel equals the scan: values and gradients, float32 and bfloat16",
     1, ("cases", "persistent-rnn-parity")),
    ("ds2_paper_bf16_b64_speedup_vs_cudnn>=2", 4, ("bench", "persistent-rnn")),
    ("ds2_paper_f32_b32_speedup_vs_cudnn>=1.5", 4, ("bench", "persistent-rnn")),
    ("ds2_paper_bf16_b256_speedup_vs_cudnn>=1.5", 4, ("bench", "persistent-rnn")),
    ("ds2_paper_bf16_b64_persistent_mfu>=0.12", 4, ("bench", "persistent-rnn")),
    ("ds2_paper_b256_persistent_compile_s<=30", 4, ("bench", "persistent-rnn")),
    ("protocol tests on CPU", 2, ("stage", "protocol")),
    ("compute-sanitizer memcheck, host engine", 2, ("stage", "sanitizer-host")),
    ("compute-sanitizer memcheck, one tiny device case", 2, ("stage", "sanitizer-device")),
    ("jax checks, host engine", 2, ("stage", "jax-host")),
    ("jax checks, device engine", 2, ("stage", "jax-device")),
    ("a misspelt engine refused with the fix", 2, ("stage", "jax-bad-engine")),
    ("MPI leg's CUDA handler: 2 processes, float64 and bitwise checks", 2, ("stage", "mpi-cuda-leg")),
    ("MPI leg's CUDA handler, reduce_scatter and all_gather modes: phases and ShardedUpdate's adamw steps",
     2, ("stage", "mpi-cuda-sharded")),
    ("correctness: k=2,8, sizes to 64M, float32 and bfloat16", 3, ("cases", "correctness-large")),
    ("ds2_paper_projected_ms<=2", 3, ("bench", "bench-buckets")),
    ("ds2_paper_b256_compile_s<=30", 2, ("bench", "compile-time")),
]
# What each setting waits for, and where it lives.
FLIPS = [
    ("default engine", ["smoke: both engines, k=2 and 8, tiny sizes",
                        "correctness: k=2,3,5,8, sizes to 1M, sums of float32, bfloat16, float16 and int32, all modes",
                        "correctness: k=2,8, every dtype by sum, max and min, sizes to 4099",
                        "256 queued steps through both CUDA engines, k=2 and 8",
                        "4KiB_f32_k8_device_us<=40", "256MiB_f32_k8_copy_fraction>=0.85",
                        "compute-sanitizer memcheck, one tiny device case", "jax checks, device engine",
                        "correctness: k=2,8, sizes to 64M, float32 and bfloat16"],
     "make 'device' the default of JAXRING_CUDA_ENGINE in RunCudaCollective "
     "(jaxring/collectives/csrc/cuda/device_ring.cu) and docs/USAGE.md"),
    ("one-shot threshold", ["correctness: k=2,3,5,8, sizes to 1M, sums of float32, bfloat16, float16 and int32, all modes"],
     "set OneShotMaxBytes (jaxring/collectives/csrc/cuda/device_ring.cu) per k to one_shot_crossover_bytes"),
    ("GPU bucket size", ["ds2_paper_projected_ms<=2"],
     "weigh best_bucket_bytes (the all-reduce alone) against DEFAULT_BUCKET_BYTES[\"gpu\"] "
     "(jaxring/collectives/fusion.py) by the step it gives in scripts/bench/project_scaling.py, which "
     "chose 64 MiB: the smallest bucket within 5% of the best step (docs/SCALING.md)"),
    ("default rnn_impl", ["persistent RNN kernel equals the scan: values and gradients, float32 and bfloat16",
                          "ds2_paper_bf16_b64_speedup_vs_cudnn>=2", "ds2_paper_f32_b32_speedup_vs_cudnn>=1.5",
                          "ds2_paper_bf16_b256_speedup_vs_cudnn>=1.5"],
     "make 'auto' the default of model.rnn_impl (models/deepspeech2/model.py's ModelConfig) and record the "
     "step times in docs/PERSISTENT_RNN.md"),
]
_BOUND = re.compile(r"(?P<name>.*?)(?P<op><=|>=)(?P<threshold>[0-9.]+)$")


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def bench_result(out, folder):
    paths = sorted(glob.glob(os.path.join(out, folder, "gpu-*.json")))
    if not paths:
        return None
    with open(paths[-1]) as f:
        return json.load(f)


def judge(out, name, source, stages):
    """(measured, passed): passed is None when nothing was measured."""
    kind, where = source
    if kind == "stage" or kind == "cases":
        stage = stages.get(where)
        if stage is None or stage["status"] in ("resolved", "skipped", "unresolved"):
            return (stage or {}).get("status", "not run"), None
        if kind == "stage":
            return stage["status"], stage["status"] == "passed"
        cases = read_lines(os.path.join(out, where + ".jsonl"))
        bad = [c for c in cases if not c["ok"]]
        measured = f"{len(cases)} cases, {len(bad)} failed ({stage['status']})"
        return measured, stage["status"] == "passed" and bool(cases) and not bad
    result = bench_result(out, where)
    value = None if result is None else result["targets"].get(name)
    if value is None:
        return "not measured", None
    bound = _BOUND.fullmatch(name)
    threshold = float(bound["threshold"])
    return value, value <= threshold if bound["op"] == "<=" else value >= threshold


def summarise(out, part):
    stages = {s["stage"]: s for s in read_lines(os.path.join(out, "stages.jsonl"))}
    targets = []
    for name, target_part, source in TARGETS:
        if target_part != part:
            targets.append(dict(name=name, part=target_part, measured=f"measured by part {target_part}", passed=None))
            continue
        measured, passed = judge(out, name, source, stages)
        targets.append(dict(name=name, part=target_part, measured=measured, passed=passed))
    by_name = {t["name"]: t for t in targets}
    flips = []
    for setting, needs, action in FLIPS:
        waiting = [n for n in needs if by_name[n]["passed"] is not True]
        flips.append(dict(setting=setting, ready_in_this_part=not [n for n in waiting if by_name[n]["part"] == part],
                          waiting_on=waiting, action=action))
    decisive = bench_result(out, "bench-decisive") or {}
    buckets = (bench_result(out, "bench-buckets") or {}).get("buckets") or []
    measurements = dict(
        one_shot_crossover_bytes=decisive.get("one_shot_crossover_bytes"),
        best_bucket_bytes=min(buckets, key=lambda b: b["measured_ms"])["bucket_bytes"] if buckets else None,
    )
    return dict(part=part, stages=list(stages.values()), targets=targets, measurements=measurements, flips=flips)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the folder gpu_check.sh wrote")
    parser.add_argument("--part", type=int, choices=(1, 2, 3, 4), required=True)
    args = parser.parse_args()
    summary = summarise(args.out, args.part)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for t in summary["targets"]:
        verdict = {True: "pass", False: "FAIL", None: "-"}[t["passed"]]
        print(f"{verdict:4}  {t['name']}: {t['measured']}")
    for flip in summary["flips"]:
        state = "ready" if not flip["waiting_on"] else "waiting on " + "; ".join(flip["waiting_on"])
        print(f"flip {flip['setting']}: {state} -> {flip['action']}")
    mine = [t for t in summary["targets"] if t["part"] == args.part]
    return 0 if all(t["passed"] for t in mine) else 1


if __name__ == "__main__":
    sys.exit(main())
