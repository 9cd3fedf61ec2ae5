"""The persistent layer's kernels on the host shim under ThreadSanitizer.

Builds jaxring/rnn/csrc/kernels_tsan.cc with the kernels (persistent_rnn.cu as host C++) and the
shim's launcher (kernel_host_grid.cc) with -fsanitize=thread, then runs it twice:

1. `kernels`: forward and backward over GRU and plain-RNN shapes, float32 and bfloat16, two
   schedule seeds. TSan must stay silent: every access a block makes to another block's data is
   ordered by a grid.sync (the shim runs each block on an OS thread of its own).
2. `race`: a kernel whose block 1 reads what block 0 writes with no grid.sync between. TSan must
   report it, or the first run proves nothing.

    python scripts/dev/sanitize_rnn_kernels.py [--out build/tsan-rnn]

About 3 minutes on 2 cores (the build 40 s; TSan makes each of a launch's thousands of fibers a
thread of its own). Needs g++ with libtsan and the CUDA headers (cuda_runtime_api.h, for types
only). Exits non-zero on any failed expectation, printing TSan's report.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "jaxring" / "rnn" / "csrc"
SOURCES = ("kernels_tsan.cc", "persistent_rnn_host.cc", "kernel_host_grid.cc")
CUDA_INCLUDES = (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include", Path("/usr/local/cuda-13.0/include"))
TSAN_OPTIONS = "halt_on_error=0 exitcode=66 history_size=4"
RUN_TIMEOUT_S = 600


def build(out: Path) -> Path:
    compiler = shutil.which("g++") or shutil.which("c++")
    include = next((path for path in CUDA_INCLUDES if (path / "cuda_runtime_api.h").exists()), None)
    if compiler is None or include is None:
        sys.exit(f"error: need g++ ({compiler}) and cuda_runtime_api.h under one of {[str(p) for p in CUDA_INCLUDES]}")
    out.mkdir(parents=True, exist_ok=True)
    program = out / "kernels_tsan"
    command = [compiler, "-std=c++17", "-O1", "-g", "-fsanitize=thread", f"-I{CSRC}", f"-I{include}",
               *(str(CSRC / source) for source in SOURCES), "-o", str(program)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return program


def run(program: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), mode], env={**os.environ, "TSAN_OPTIONS": TSAN_OPTIONS},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "tsan-rnn", help="where the program is built")
    args = parser.parse_args()
    program = build(args.out)
    kernels = run(program, "kernels")
    race = run(program, "race")
    failures = []
    if "ThreadSanitizer" in kernels.stderr or kernels.returncode != 0:
        failures.append(f"the kernels: exit {kernels.returncode}\n{kernels.stdout}{kernels.stderr[-6000:]}")
    if "WARNING: ThreadSanitizer: data race" not in race.stderr:
        failures.append(f"the unordered kernel raised no report (is TSan watching the blocks?):\n{race.stderr[-2000:]}")
    print(f"kernels: {kernels.stdout.strip()}; TSan reports: {kernels.stderr.count('WARNING: ThreadSanitizer')}")
    print(f"race check: TSan reports: {race.stderr.count('WARNING: ThreadSanitizer')} (expected at least 1)")
    if failures:
        sys.exit("error:\n" + "\n".join(failures))
    print("ok")


if __name__ == "__main__":
    main()
