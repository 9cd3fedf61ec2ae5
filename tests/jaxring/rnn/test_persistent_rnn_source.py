"""The persistent layer's CUDA source compiles for sm_80 and sm_90 with no spills (ptxas -v).

Compile only: no GPU runs it here (docs/PERSISTENT_RNN.md, "Status").
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "jaxring" / "rnn" / "csrc" / "persistent_rnn.cu"
NVCC = shutil.which("nvcc") or next(iter(sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)
# 64 registers x 1024 threads is the 64K-register file of one SM on both architectures,
# so any block size up to the maximum keeps one block per SM resident.
MAX_REGISTERS = 64


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_compiles_for_ampere_and_hopper_without_spills(tmp_path):
    arches = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    result = subprocess.run([str(NVCC), "-std=c++17", "-O3", "-c", "--threads", "2", *arches, "-Xptxas=-v", str(SOURCE),
                             "-o", str(tmp_path / "persistent_rnn.o")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    entries = re.findall(r"Compiling entry function '(\w+)' for '(sm_\d+)'", report)
    # Forward and backward, float32 and bfloat16, on both architectures.
    assert len(entries) == 8 and {arch for _, arch in entries} == {"sm_80", "sm_90"}, report
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert len(spills) == 16 and not any(spills), report
    assert len(registers) == 8 and max(registers) <= MAX_REGISTERS, report
