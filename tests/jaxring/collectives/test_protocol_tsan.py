"""The device ring's publish pattern under ThreadSanitizer (csrc/testing/protocol_tsan.cc).

Many threads of a lane write, meet at a barrier, and thread i releases flag i
(a flag released by a thread that wrote little of the data), as the GPU
kernel does. The program is built with -fsanitize=thread here; without a
mutation TSan is silent and the sums are right, and each mutation that
breaks the ordering (no barrier before the release, a relaxed store, a
relaxed load) makes TSan report a data race.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[3] / "jaxring" / "collectives" / "csrc"
COMPILER = shutil.which("c++") or shutil.which("g++")
MUTATIONS = {0: "none", 1: "no barrier before the release", 2: "relaxed store", 3: "relaxed load"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if COMPILER is None:
        pytest.skip("no C++ compiler on PATH")
    folder = tmp_path_factory.mktemp("tsan")
    builds = {m: subprocess.Popen([COMPILER, "-std=c++17", "-O1", "-g", "-fsanitize=thread",
                                   f"-DJAXRING_TSAN_MUTATION={m}", f"-I{CSRC}", str(CSRC / "testing" / "protocol_tsan.cc"),
                                   "-o", str(folder / f"protocol_tsan_{m}")],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for m in MUTATIONS}
    for m, build in builds.items():
        output, _ = build.communicate(timeout=300)
        assert build.returncode == 0, f"building mutation {m} failed:\n{output}"
    return {m: folder / f"protocol_tsan_{m}" for m in MUTATIONS}


def run(program):
    # halt_on_error=0: run to the end, so the sums are checked too.
    env = {"TSAN_OPTIONS": "halt_on_error=0 exitcode=66"}
    return subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=300)


def test_the_gpu_publish_pattern_is_race_free_and_sums_right(programs):
    done = run(programs[0])
    assert "ThreadSanitizer" not in done.stderr, done.stderr[:4000]
    assert done.returncode == 0, done.stdout + done.stderr[:2000]
    assert "ring 0 wrong elements, one-shot 0, push 0" in done.stdout


@pytest.mark.parametrize("mutation", [1, 2, 3], ids=lambda m: MUTATIONS[m].replace(" ", "_"))
def test_breaking_the_ordering_makes_tsan_report(programs, mutation):
    done = run(programs[mutation])
    assert "WARNING: ThreadSanitizer: data race" in done.stderr, done.stdout + done.stderr[:2000]
    assert done.returncode == 66
