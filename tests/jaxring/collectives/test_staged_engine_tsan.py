"""The host-staged engine's meeting under ThreadSanitizer (csrc/testing/staged_tsan.cc).

Executions started in shuffled orders on the ranks, several in flight per rank, the engine's meeting and walk
through the schedule run as on a GPU with the stages done on host memory (csrc/testing/host_staged.h), built with
-fsanitize=thread: TSan must stay silent (the place's and the sessions' locks order every access) and every sum
be right.
"""

import shutil
import subprocess
from pathlib import Path

import jax.ffi
import pytest

CSRC = Path(__file__).resolve().parents[3] / "jaxring" / "collectives" / "csrc"
COMPILER = shutil.which("c++") or shutil.which("g++")


def test_executions_in_any_order_are_race_free_and_sum_right(tmp_path):
    if COMPILER is None:
        pytest.skip("no C++ compiler on PATH")
    program = tmp_path / "staged_tsan"
    sources = ["testing/staged_tsan.cc", "cuda/staged_meeting.cc", "core/meeting.cc", "core/timeout.cc"]
    build = subprocess.run([COMPILER, "-std=c++17", "-O1", "-g", "-fsanitize=thread", f"-I{CSRC}",
                            f"-I{jax.ffi.include_dir()}", *(str(CSRC / source) for source in sources),
                            "-o", str(program)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    done = subprocess.run([str(program)], env={"TSAN_OPTIONS": "halt_on_error=0 exitcode=66"},
                          capture_output=True, text=True, timeout=300)
    assert "ThreadSanitizer" not in done.stderr, done.stderr[:4000]
    assert done.returncode == 0 and "0 wrong elements or failed calls" in done.stdout, done.stdout + done.stderr[:2000]
