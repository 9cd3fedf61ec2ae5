"""scripts/dev/mpi4jax_tests.py runs mpi4jax's own tests against jaxring.mpi4jax: a small selection here.

The full run (its counts are in docs/USAGE.md, "Coming from mpi4jax") takes a minute of two
processes; here one test of each op and one that differs on purpose, under mpirun -np 2. The
installed mpi4jax's sdist comes from data/cache/mpi4jax/, or from PyPI on the first run.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "dev"))

import mpi4jax_tests  # noqa: E402

SELECTION = "test_allreduce_jit or test_reduce_jit or test_allgather_jit or test_allreduce_vjp"


def test_only_the_imports_change():
    text = "import jax\nimport mpi4jax\n    from mpi4jax import allreduce\nimport mpi4jax_other\n"
    changed, count = mpi4jax_tests.rewritten(text)
    assert count == 2
    assert changed == ("import jax\nimport jaxring.mpi4jax as mpi4jax\n    from jaxring.mpi4jax import allreduce\n"
                       "import mpi4jax_other\n")


def test_a_selection_of_mpi4jax_tests_passes_against_the_drop_in(tmp_path):
    result = mpi4jax_tests.main(["-k", SELECTION, "--timeout", "120", "--json", str(tmp_path / "counts.json")])
    tests = result["drop_in"]["tests"]
    assert {name: o["outcome"] for name, o in tests.items()} == {
        "test_allreduce::test_allreduce_jit": "taken",
        "test_reduce::test_reduce_jit": "taken",
        "test_allgather::test_allgather_jit": "taken",
        # jaxring's gradient of a sum over processes is that sum: 2x mpi4jax's identity over 2 processes.
        "test_allreduce::test_allreduce_vjp": "failed",
    }, tests
    assert tests["test_allreduce::test_allreduce_vjp"]["on_purpose"] == mpi4jax_tests.GRADIENT
