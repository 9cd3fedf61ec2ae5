"""The CUDA engines' host sides under ThreadSanitizer, built with -fsanitize=thread: executions started in
shuffled orders on the ranks, several in flight per rank; TSan must stay silent and every sum be right.

- device engine (csrc/testing/engine_tsan.cc): fewer sessions than executions in flight, the kernels played on
  host threads over the engine's flags (csrc/testing/engine_fake.h); the ring's lock, the sessions' atomics and
  the finished words order every access.
- host-staged engine (csrc/testing/staged_tsan.cc): its meeting and walk through the schedule as on a GPU, the
  stages done on host memory (csrc/testing/host_staged.h); the place's and the sessions' locks order every access.
"""

import shutil
import subprocess
from pathlib import Path

import jax.ffi
import pytest

CSRC = Path(__file__).resolve().parents[3] / "jaxring" / "collectives" / "csrc"
COMPILER = shutil.which("c++") or shutil.which("g++")
MEETING = ["core/meeting.cc", "core/timeout.cc"]
ENGINES = {
    "device": ["testing/engine_tsan.cc", "cuda/device_engine.cc", *MEETING],
    "host_staged": ["testing/staged_tsan.cc", "cuda/staged_meeting.cc", *MEETING],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_executions_in_any_order_are_race_free_and_sum_right(tmp_path, engine):
    if COMPILER is None:
        pytest.skip("no C++ compiler on PATH")
    program = tmp_path / f"{engine}_tsan"
    build = subprocess.run([COMPILER, "-std=c++17", "-O1", "-g", "-fsanitize=thread", f"-I{CSRC}",
                            f"-I{jax.ffi.include_dir()}", *(str(CSRC / source) for source in ENGINES[engine]),
                            "-o", str(program)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    done = subprocess.run([str(program)], env={"TSAN_OPTIONS": "halt_on_error=0 exitcode=66"},
                          capture_output=True, text=True, timeout=300)
    assert "ThreadSanitizer" not in done.stderr, done.stderr[:4000]
    assert done.returncode == 0 and "0 wrong elements or failed calls" in done.stdout, done.stdout + done.stderr[:2000]
