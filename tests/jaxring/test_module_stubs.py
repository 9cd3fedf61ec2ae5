"""The compiled modules a user's install gets have type stubs beside them (jaxring/**/_jaxring_*.pyi), so that an
editor sees their signatures: each stub is what nanobind's stubgen writes from the built module, and names what the
module's NB_MODULE block defines (which also checks the stub of a module not built here, e.g. without nvcc).

Regenerate one after changing its module: python -m nanobind.stubgen -q -m MODULE -o PATH.pyi"""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def library_modules() -> dict[str, Path]:
    """Each compiled module CMakeLists.txt installs outside its `if(JAXRING_BUILD_TESTING)` blocks (the test modules
    have no stubs: only the tests call them): its dotted name -> its stub's path."""
    outside, testing_blocks = [], []
    for line in (ROOT / "CMakeLists.txt").read_text().splitlines():
        word = re.match(r"\s*(if|endif)\(", line)
        if word and word.group(1) == "if":
            testing_blocks.append("JAXRING_BUILD_TESTING" in line)
        elif word:
            testing_blocks.pop()
        elif not any(testing_blocks):
            outside.append(line)
    installs = re.findall(r"install\(TARGETS (\w+) LIBRARY DESTINATION ([\w/]+)\)", "\n".join(outside))
    return {f"{folder.replace('/', '.')}.{name}": ROOT / folder / f"{name}.pyi" for name, folder in installs}


MODULES = library_modules()


def test_the_library_modules_and_only_they_have_stubs():
    assert set(MODULES) == {"jaxring.collectives._jaxring_cpu", "jaxring.collectives._jaxring_cuda",
                            "jaxring.collectives._jaxring_mpi", "jaxring.rnn._jaxring_rnn_cuda"}
    assert sorted((ROOT / "jaxring").rglob("*.pyi")) == sorted(MODULES.values())


@pytest.mark.parametrize("module", MODULES)
def test_a_stub_is_what_stubgen_writes_from_the_built_module(module, tmp_path):
    try:
        importlib.import_module(module)
    except ImportError as error:
        pytest.skip(f"{module} is not built here ({error}); the next test checks its stub against its source")
    written = tmp_path / "stub.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", module, "-o", str(written)], check=True)
    stub = MODULES[module]
    assert stub.read_text() == written.read_text(), (
        f"{stub.relative_to(ROOT)} is not what stubgen writes from the built module; if the module changed, regenerate "
        f"the stub: python -m nanobind.stubgen -q -m {module} -o {stub.relative_to(ROOT)}")


def defined_in_source(name: str) -> set[str]:
    """What module `name`'s NB_MODULE block binds with m.def and m.attr."""
    for source in (ROOT / "jaxring").rglob("*.cc"):
        block = re.search(rf"NB_MODULE\({name}, m\) \{{(.*?)^\}}", source.read_text(), re.S | re.M)
        if block:
            return set(re.findall(r'\bm\.(?:def|attr)\("(\w+)"', block.group(1)))
    raise AssertionError(f"no NB_MODULE({name}, m) under jaxring/")


def stubbed(stub: Path) -> set[str]:
    """The functions and values a stub declares at its top level."""
    tree = ast.parse(stub.read_text())
    return ({node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            | {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)})


@pytest.mark.parametrize("module", MODULES)
def test_a_stub_names_what_the_modules_source_binds(module):
    assert stubbed(MODULES[module]) == defined_in_source(module.rsplit(".", 1)[1])
