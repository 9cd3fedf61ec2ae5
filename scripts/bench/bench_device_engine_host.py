"""Host time per call per rank of the device engine, on CPU, with launches that do nothing.

Ranks are host threads over a fake CUDA (csrc/testing/module_engine_test.cc): what is
timed is the engine's own per-call path (finding the ring, publishing,
the meeting of the call's execution, the launch arguments), not CUDA's launch. With more
ranks than cores the meeting waits on the scheduler: wall time then includes
waiting for descheduled peers, and each thread's CPU time separates the
engine's own cost (spinning and yielding included); compare k against the
machine's cores. Target: <= 5 us per rank per call at k = 8.

    flock /tmp/jaxring-bench.lock python scripts/bench/bench_device_engine_host.py
"""

import argparse
import json
import os

from jaxring.collectives import _jaxring_engine_test as engine_test


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,8")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5, help="the best of this many runs is reported")
    args = parser.parse_args()
    result = {"cores": os.cpu_count(), "load_average": os.getloadavg(), "calls": args.calls,
              "wall_ns_per_call_per_rank": {}, "cpu_ns_per_call_per_rank": {}}
    for k in map(int, args.ranks.split(",")):
        fake = engine_test.Fake(k)
        runs = [fake.time_calls(k, args.calls, op_id) for op_id in range(1, args.repeats + 1)]
        wall, cpu = min(runs)
        result["wall_ns_per_call_per_rank"][k] = round(wall, 1)
        result["cpu_ns_per_call_per_rank"][k] = round(cpu, 1)
        print(f"k={k}: {wall / 1000:.2f} us wall, {cpu / 1000:.2f} us CPU per call per rank "
              f"(the run of least wall time of {args.repeats})", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
