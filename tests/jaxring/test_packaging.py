"""The installed library stands alone: jaxring and its engine import without models/ or the speech extra; its C++
is laid out by role, and the test modules are not part of it."""

import re
import subprocess
import sys
from pathlib import Path

SPEECH_EXTRA = ("jiwer", "soundfile", "soxr", "scipy", "espeakng_loader", "tensorboardX", "matplotlib")

_IMPORT_WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("not installed: " + name)
sys.meta_path.insert(0, Block())
import jaxring, jaxring.engine.trainer, jaxring.engine.sync, jaxring.engine.metrics
print(jaxring.allreduce.__name__, jaxring.tree_allreduce.__name__, jaxring.init.__name__)
"""


def test_library_imports_without_the_speech_extra_or_models():
    code = _IMPORT_WITHOUT.format(blocked=(*SPEECH_EXTRA, "models"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["allreduce", "tree_allreduce", "init"]


ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "jaxring" / "collectives" / "csrc"
# csrc's folders, each with the folders it may include from (its own too): the engines build on core/ alone, the
# Python bindings on the engines, and only testing/ sees everything.
CSRC_LAYERS = {
    "core": {"core"},
    "cpu": {"core", "cpu"},
    "cuda": {"core", "cuda"},
    "mpi": {"core", "mpi"},
    "python": {"core", "cpu", "cuda", "mpi", "python"},
    "testing": {"core", "cpu", "cuda", "mpi", "testing"},
}


def test_csrc_is_laid_out_by_role_and_each_folder_includes_only_its_layers():
    sources = [path for path in CSRC.rglob("*") if path.is_file()]
    assert all(path.parent.parent == CSRC and path.parent.name in CSRC_LAYERS for path in sources), sorted(
        str(path.relative_to(CSRC)) for path in sources if path.parent.name not in CSRC_LAYERS)
    wrong = [(str(path.relative_to(CSRC)), included) for path in sources
             for included in re.findall(r'^#include "(\w+)/', path.read_text(), re.M)
             if included != "xla" and included not in CSRC_LAYERS[path.parent.name]]
    assert not wrong, f"includes across the layers (file, folder it includes from): {wrong}"


def test_the_test_modules_build_only_when_asked():
    """A user's `pip install .` gets the library's modules alone; csrc/testing/ and the RNN's host test build only
    with JAXRING_BUILD_TESTING (make test and scripts/gpu/gpu_check.sh turn it on)."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    asked, depth = [], 0
    for line in cmake.splitlines():
        line = line.strip()
        if line.startswith("if(JAXRING_BUILD_TESTING)"):
            depth += 1
        elif depth and line.startswith("if("):
            depth += 1
        elif depth and line.startswith("endif("):
            depth -= 1
        module = re.match(r"nanobind_add_module\((\w+)", line)
        if module:
            asked.append((module.group(1), depth > 0))
    testing = {name for name, only_when_asked in asked if only_when_asked}
    assert testing == {"_jaxring_cpu_engine_test", "_jaxring_protocol", "_jaxring_engine_test",
                       "_jaxring_cuda_harness", "_jaxring_rnn_host_test"}, asked
    assert re.search(r'option\(JAXRING_BUILD_TESTING "[^"]*" OFF\)', cmake)
    for turns_it_on in ("Makefile", "scripts/gpu/gpu_check.sh"):
        assert "cmake.define.JAXRING_BUILD_TESTING=ON" in (ROOT / turns_it_on).read_text(), turns_it_on
