"""The installed library stands alone: jaxring and its engine import without models/ or the speech extra; its C++
is laid out by role, and the test modules are not part of it."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


SCIKIT_BUILD_CORE_READ_WITH = "1.1.2"  # the version whose (private) file selection wheel_files() calls
PLATLIB = Path("/platlib-of-the-wheel")  # not on disk: scikit-build-core skips sources CMake already installed there
CPP_SUFFIXES = {".cc", ".cu", ".h", ".cuh", ".cpp", ".hpp"}


def wheel_files() -> set[str]:
    """The checkout's files `pip install .` puts in the wheel, as scikit-build-core selects them with pyproject.toml's
    settings (the compiled modules come from CMake's install instead)."""
    from importlib.metadata import version

    import pathspec

    try:
        from scikit_build_core.build._editable import get_packages
        from scikit_build_core.build._pathutil import packages_to_file_mapping
        from scikit_build_core.settings.skbuild_read_settings import SettingsReader

        settings = SettingsReader(tomllib.loads((ROOT / "pyproject.toml").read_text()), {}, state="wheel").settings
        selected = packages_to_file_mapping(
            packages=get_packages(packages=settings.wheel.packages, name="jaxring"), platlib_dir=PLATLIB,
            include=settings.sdist.include, src_exclude=settings.sdist.exclude,
            target_exclude=settings.wheel.exclude, build_dir=settings.build_dir, mode=settings.sdist.inclusion_mode)
    except (ImportError, TypeError, AttributeError) as error:
        pytest.fail(f"scikit-build-core {version('scikit-build-core')} selects a wheel's files otherwise than "
                    f"{SCIKIT_BUILD_CORE_READ_WITH} did ({error!r}): update wheel_files() to its new helpers")
    # The wheel's writer applies wheel.exclude once more, to the paths inside the wheel.
    written = pathspec.GitIgnoreSpec.from_lines(settings.wheel.exclude)
    inside = {Path(target).relative_to(PLATLIB).as_posix() for target in selected.values()}
    return {path for path in inside if not written.match_file(path)}


def test_the_wheel_carries_the_python_package_and_stubs_without_any_cpp_source(monkeypatch):
    monkeypatch.chdir(ROOT)  # scikit-build-core walks the project from its root
    files = wheel_files()
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "jaxring").rglob("*.py*")
               if path.suffix in (".py", ".pyi") and "__pycache__" not in path.parts}
    assert any(path.endswith(".pyi") for path in sources)
    assert sources <= files, sorted(sources - files)
    cpp = sorted(path for path in files if "csrc" in path.split("/") or Path(path).suffix in CPP_SUFFIXES)
    assert not cpp, cpp
