"""The persistent layer's CUDA source compiles for sm_80 and sm_90 with no spills (ptxas -v), its FFI
handler module compiles without warnings, and the built extension offers both targets.

Compile and import only: no GPU runs them here (docs/PERSISTENT_RNN.md, "Status").
"""

import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from jaxring.rnn import plan as rnn_plan

CSRC = Path(__file__).resolve().parents[3] / "jaxring" / "rnn" / "csrc"
NVCC = shutil.which("nvcc") or next(iter(sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
# The 64K-register file of one SM on both architectures, over the kernels' threads per block:
# at most this many registers a thread keep one block per SM resident.
MAX_REGISTERS = 65536 // rnn_plan.THREADS_PER_BLOCK


@needs_nvcc
def test_compiles_for_ampere_and_hopper_without_spills(tmp_path):
    arches = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    # The device code alone (--fatbin: the same ptxas report at half the CPU of -c); the build compiles
    # the whole file, its host code too, for both architectures (CMakeLists.txt's jaxring_persistent_rnn).
    result = subprocess.run([str(NVCC), "-std=c++17", "-O3", "--fatbin", "--threads", "2", *arches, "-Xptxas=-v",
                             str(CSRC / "persistent_rnn.cu"), "-o", str(tmp_path / "persistent_rnn.fatbin")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    entries = re.findall(r"Compiling entry function '(\w+)' for '(sm_\d+)'", report)
    # Forward and backward, float32 and bfloat16, on both architectures.
    assert len(entries) == 8 and {arch for _, arch in entries} == {"sm_80", "sm_90"}, report
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert len(spills) == 16 and not any(spills), report
    assert len(registers) == 8 and max(registers) <= MAX_REGISTERS, report


@needs_nvcc
def test_handler_module_compiles_without_warnings(tmp_path):
    import jax.ffi
    import nanobind

    includes = [jax.ffi.include_dir(), nanobind.include_dir(), sysconfig.get_paths()["include"]]
    # nvcc hands a .cc file to the host compiler with the CUDA headers on its path, as CMake's build does.
    result = subprocess.run([str(NVCC), "-std=c++17", "-c", "-Xcompiler=-Wall,-Wextra,-Werror",
                             *(f"-isystem={i}" for i in includes), str(CSRC / "module_rnn_cuda.cc"),
                             "-o", str(tmp_path / "module_rnn_cuda.o")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@needs_nvcc
def test_the_build_offers_both_targets_and_reads_the_device_it_is_asked_for():
    # Where nvcc is, CMakeLists.txt builds the module: its absence means the build skipped it.
    assert importlib.util.find_spec("jaxring.rnn._jaxring_rnn_cuda"), "rebuild: pip install --no-build-isolation -e ."
    from jaxring.rnn import _jaxring_rnn_cuda as module

    assert set(module.registrations()) == {module.FORWARD_TARGET, module.BACKWARD_TARGET}
    # No GPU on the test machines: reading one is an error naming the device.
    probe = "from jaxring.rnn import _jaxring_rnn_cuda as m; m.device_budget(7)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        pytest.skip("this machine has a GPU 7")
    assert "reading CUDA device 7's attributes" in result.stderr, result.stderr


@needs_nvcc
def test_plan_sizes_shared_memory_and_blocks_as_the_kernels_do():
    from jaxring.rnn import _jaxring_rnn_cuda as module

    assert module.THREADS_PER_BLOCK == rnn_plan.THREADS_PER_BLOCK
    roomy = rnn_plan.DeviceBudget("roomy", sms=132, shared_bytes_per_block=1 << 30)
    for hidden, gates, batch, directions, weight_bytes, device in [
            (620, 3, 64, 2, 2, rnn_plan.H100), (620, 3, 32, 2, 4, rnn_plan.H100), (620, 3, 256, 2, 2, rnn_plan.H100),
            (620, 3, 64, 2, 2, rnn_plan.A100), (7, 3, 1, 1, 4, roomy), (333, 1, 17, 2, 2, roomy),
            (129, 3, 200, 2, 4, rnn_plan.DeviceBudget("four", sms=4, shared_bytes_per_block=1 << 30)),
            (800, 1, 3, 1, 4, rnn_plan.DeviceBudget("tight", sms=32, shared_bytes_per_block=140_000))]:
        plan = rnn_plan.plan_layer(hidden, gates, batch, directions, weight_bytes, device)
        assert not isinstance(plan, str), plan
        got = module.shared_bytes(directions, batch, hidden, gates, plan.unit_groups, plan.batch_rows,
                                  plan.forward_chunk, plan.backward_chunk, weight_bytes)
        assert got == (plan.forward_bytes, plan.backward_bytes), (hidden, gates, batch, weight_bytes, device.name)

