"""scripts/gpu/gpu_check.sh on CPU: a dry run of both parts (every command resolves, the CPU
stages run), and the summary's verdicts on made-up results."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import gpu_check_summary as summary_lib  # noqa: E402

STAGE_SOURCES = {where for _, _, (kind, where) in summary_lib.TARGETS if kind != "bench"}
BENCH_FOLDERS = {where for _, _, (kind, where) in summary_lib.TARGETS if kind == "bench"}


SCRIPT_TEXT = SCRIPT.read_text()
BUDGET_S = int(SCRIPT_TEXT.split('BUDGET_S="${GPU_CHECK_BUDGET_S:-')[1].split("}")[0])
SUMMARY_RESERVE_S = int(SCRIPT_TEXT.split("SUMMARY_RESERVE_S=")[1].split()[0])


# Part 2's one CPU stage, protocol, runs pytest on test_ring_protocol.py and test_schedule.py, which the
# suite runs in full itself: the dry run leaves out their two longest functions (about three quarters of
# their 772 cases and 20 s), and still runs the stage's command to a pass on every other function.
PROTOCOL_STAGE_SELECTION = "-k 'not random_delays and not consecutive_calls'"


def dry_run(out, part, python=sys.executable):
    addopts = " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), PROTOCOL_STAGE_SELECTION]))
    env = dict(os.environ, OUT=str(out), GPU_CHECK_DRY_RUN="1", PYTHON=python, PYTEST_ADDOPTS=addopts)
    return subprocess.run(["bash", str(SCRIPT), str(part)], env=env, capture_output=True, text=True, timeout=300)


# The GPU image has compute-sanitizer; a CPU machine's CUDA toolkit may lack it.
SANITIZER_HERE = shutil.which("compute-sanitizer") is not None
SANITIZER_STAGES = {"sanitizer-host", "sanitizer-device"}


@pytest.mark.parametrize("part", [1, 2, 3, 4])
def test_dry_run_resolves_every_stage_and_runs_the_cpu_ones(tmp_path, part):
    done = dry_run(tmp_path, part)
    stages = {s["stage"]: s for s in summary_lib.read_lines(tmp_path / "stages.jsonl")}
    # A stage gets the smaller of its limit and what is left of the part's budget: limits adding up
    # to more would let one hung stage skip the stages after it.
    assert sum(s["limit_s"] for s in stages.values()) <= BUDGET_S - SUMMARY_RESERVE_S, stages
    unresolved = {name for name, s in stages.items() if s["status"] == "unresolved"}
    expected_unresolved = SANITIZER_STAGES if part == 2 and not SANITIZER_HERE else set()
    assert unresolved == expected_unresolved, done.stdout + done.stderr
    assert done.returncode == (1 if expected_unresolved else 0), done.stdout + done.stderr
    for name in expected_unresolved:
        assert (tmp_path / f"{name}.log").read_text() == "not found: compute-sanitizer\n"
    stages = {name: s for name, s in stages.items() if name not in expected_unresolved}
    # Every stage a target of this part reads, and every benchmark, is there.
    mine = {where for _, p, (_, where) in summary_lib.TARGETS if p == part}
    assert mine <= set(stages) | expected_unresolved, mine - set(stages)
    assert stages["build"]["status"] == "resolved"
    ran = {name for name, s in stages.items() if s["status"] == "passed"}
    assert ran == {1: {"import"}, 2: {"protocol"}, 3: set(), 4: set()}[part]
    if part == 2:
        assert " deselected" in (tmp_path / "protocol.log").read_text()  # PROTOCOL_STAGE_SELECTION, not all 772
    assert all(s["status"] in ("resolved", "passed") for s in stages.values()), stages
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [t["name"] for t in summary["targets"]] == [name for name, _, _ in summary_lib.TARGETS]


def test_a_command_that_does_not_resolve_fails_the_dry_run(tmp_path):
    done = dry_run(tmp_path, 1, python="no-such-python-here")
    assert done.returncode != 0
    stages = summary_lib.read_lines(tmp_path / "stages.jsonl")
    assert {s["status"] for s in stages} == {"unresolved"}
    assert "not found: no-such-python-here" in done.stdout


def test_the_part_is_required(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], env=dict(os.environ, OUT=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


def write_part1(out, *, latency_us, smoke_ok=True):
    stages = [dict(stage=s, status="passed", rc=0, seconds=1, limit_s=60) for s in ("build", "import", "smoke",
                                                                                     "correctness", "bench-decisive")]
    (out / "stages.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stages))
    cases = [dict(ok=True), dict(ok=smoke_ok)]
    (out / "smoke.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    (out / "correctness.jsonl").write_text(json.dumps(dict(ok=True)) + "\n")
    (out / "bench-decisive").mkdir()
    targets = {"4KiB_f32_k8_device_us<=40": latency_us, "4KiB_f32_k2_device_us<=20": 12.0,
               "4KiB_f32_k8_host_speedup>=8": 9.5, "256MiB_f32_k8_copy_fraction>=0.85": 0.9,
               "256MiB_bf16_k8_copy_fraction>=0.80": 0.79, "ds2_paper_projected_ms<=2": None}
    (out / "bench-decisive" / "gpu-h100-2026-11-24.json").write_text(
        json.dumps(dict(targets=targets, one_shot_crossover_bytes={"2": 65536, "8": 16384}, buckets=[])))


def test_summary_judges_each_target_against_its_bound(tmp_path):
    write_part1(tmp_path, latency_us=41.0)
    first = summary_lib.summarise(str(tmp_path), 1)
    assert {t["name"]: t["passed"] for t in first["targets"]}["smoke: both engines, k=2 and 8, tiny sizes"] is True
    s = summary_lib.summarise(str(tmp_path), 3)  # the benchmarks' part
    verdicts = {t["name"]: t["passed"] for t in s["targets"]}
    assert verdicts["4KiB_f32_k8_device_us<=40"] is False  # 41 > 40
    assert verdicts["4KiB_f32_k2_device_us<=20"] is True
    assert verdicts["4KiB_f32_k8_host_speedup>=8"] is True
    assert verdicts["256MiB_bf16_k8_copy_fraction>=0.80"] is False  # 0.79 < 0.80
    assert all(t["passed"] is None for t in s["targets"] if t["part"] == 2)
    assert s["measurements"]["one_shot_crossover_bytes"] == {"2": 65536, "8": 16384}
    flips = {f["setting"]: f for f in s["flips"]}
    assert flips["one-shot threshold"]["ready_in_this_part"] is True
    assert flips["default engine"]["ready_in_this_part"] is False
    assert "4KiB_f32_k8_device_us<=40" in flips["default engine"]["waiting_on"]


def test_summary_fails_a_harness_file_with_one_bad_case(tmp_path):
    write_part1(tmp_path, latency_us=30.0, smoke_ok=False)
    s = summary_lib.summarise(str(tmp_path), 1)
    smoke = next(t for t in s["targets"] if t["name"].startswith("smoke"))
    assert smoke["passed"] is False and smoke["measured"].startswith("2 cases, 1 failed")
