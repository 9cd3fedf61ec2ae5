"""scripts/dev/lax_conformance.py counts what jaxring takes of jax.lax's collectives, on a test file of its own.

The test writes a stand-in for a JAX checkout (jax/version.py at the installed version, a pyproject.toml,
tests/collectives_test.py in JAX's style: written here, not copied) and runs the script on it: each test
of that file makes one collective call whose fate is known (taken, refused by a reason, raised, lax's own
error, or left to lax as jax's own code's), checks its result against numpy in float64 (so a refused call's
fallback to lax is checked too), and the script's JSON must count them so. Calls whose fate changes as
jaxring takes more (max, vmap axes, groups) may be either taken or refused by their one reason.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "dev" / "lax_conformance.py"
sys.path.insert(0, str(ROOT / "scripts" / "dev"))

import lax_conformance  # noqa: E402

COLLECTIVES_TEST = '''
import functools

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

N = jax.device_count()
RNG = np.random.default_rng(45)


def rows(cols=3, dtype=np.float32):
    return RNG.standard_normal((N, cols)).astype(dtype)


def on_every_device(value):
    return np.broadcast_to(value, (N,) + np.shape(value))


def test_psum_pmap():
    x = rows()
    out = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)
    np.testing.assert_allclose(out, on_every_device(x.astype(np.float64).sum(0)), rtol=1e-5, atol=1e-6)


def test_pmean_shard_map():
    x = rows(cols=5)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    f = jax.jit(jax.shard_map(lambda v: lax.pmean(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    np.testing.assert_allclose(f(x), x.astype(np.float64).mean(0, keepdims=True), rtol=1e-5, atol=1e-6)


def test_all_gather_tiled_with_lax_default_groups():
    x = rows(cols=2)
    out = jax.pmap(lambda v: lax.all_gather(v, "i", axis_index_groups=None, tiled=True), axis_name="i")(x)
    np.testing.assert_array_equal(out, on_every_device(x.reshape(-1)))


def test_psum_scatter_tiled():
    x = RNG.standard_normal((N, 2, 3 * N)).astype(np.float32)
    out = jax.pmap(lambda v: lax.psum_scatter(v, "i", scatter_dimension=1, tiled=True), axis_name="i")(x)
    total = x.astype(np.float64).sum(0)
    np.testing.assert_allclose(out, np.stack([total[:, 3 * r : 3 * r + 3] for r in range(N)]), rtol=1e-5, atol=1e-6)


def test_psum_handed_to_pmap():
    x = rows()
    out = jax.pmap(functools.partial(lax.psum, axis_name="i"), axis_name="i")(x)
    np.testing.assert_allclose(out, on_every_device(x.astype(np.float64).sum(0)), rtol=1e-5, atol=1e-6)


def test_psum_named_by_jax_code_stays_lax():
    namespace = {"__name__": "jax._src.lax_conformance_probe", "lax": lax}
    exec("def total(v):\\n    return lax.psum(v, 'i')\\n", namespace)
    x = rows()
    assert "psum" in str(jax.make_jaxpr(namespace["total"], axis_env=[("i", N)])(x[0]))
    out = jax.pmap(namespace["total"], axis_name="i")(x)
    np.testing.assert_allclose(out, on_every_device(x.astype(np.float64).sum(0)), rtol=1e-5, atol=1e-6)


def test_all_gather_over_a_device_and_a_vmap_axis():
    # jaxring refuses it by name, falls back to lax, and lax refuses it too
    with pytest.raises(AssertionError):
        jax.pmap(jax.vmap(lambda v: lax.all_gather(v, ("i", "b")), axis_name="b"), axis_name="i")(np.ones((N, 2, 3)))


def test_pmax():
    x = rows()
    out = jax.pmap(lambda v: lax.pmax(v, "i"), axis_name="i")(x)
    np.testing.assert_array_equal(out, on_every_device(x.max(0)))


def test_psum_over_a_vmap_axis():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    out = jax.vmap(lambda v: lax.psum(v, "j"), axis_name="j")(x)
    np.testing.assert_allclose(out, np.broadcast_to(x.astype(np.float64).sum(0), x.shape), rtol=1e-5, atol=1e-6)


def test_psum_of_groups():
    x = rows()
    groups = [list(range(0, N, 2)), list(range(1, N, 2))]
    out = jax.pmap(lambda v: lax.psum(v, "i", axis_index_groups=groups), axis_name="i")(x)
    sums = {r: x[group].astype(np.float64).sum(0) for group in groups for r in group}
    np.testing.assert_allclose(out, np.stack([sums[r] for r in range(N)]), rtol=1e-5, atol=1e-6)


def test_psum_scatter_of_a_wrong_size():
    x = rows(cols=N + 1)
    with pytest.raises(ValueError):
        jax.pmap(lambda v: lax.psum_scatter(v, "i"), axis_name="i")(x)


def test_psum_with_an_argument_lax_does_not_take():
    with pytest.raises(TypeError):
        lax.psum(rows(), "i", "surplus")


def test_jaxpr_names_psum():
    jaxpr = jax.make_jaxpr(lambda v: lax.psum(v, "i"), axis_env=[("i", N)])(rows()[0])
    assert "psum" in str(jaxpr)


def test_wrong_reference_fails_with_lax_too():
    x = rows()
    out = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)
    np.testing.assert_allclose(out, x)
'''

# The one call of each test of COLLECTIVES_TEST, as the script's calls_by_test counts it: the set of
# what it may be (a call jaxring is being taught to take is taken or refused by its one reason).
EXPECTED_CALLS = {
    "test_psum_pmap": [{"taken": 1}],
    "test_pmean_shard_map": [{"taken": 1}],
    "test_all_gather_tiled_with_lax_default_groups": [{"taken": 1}],
    "test_psum_scatter_tiled": [{"taken": 1}],
    "test_psum_handed_to_pmap": [{"taken": 1}],
    "test_all_gather_over_a_device_and_a_vmap_axis": [{"refused: vmap axis in a tuple of a gather or scatter": 1}],
    "test_pmax": [{"taken": 1}, {"refused: reduction max": 1}],
    "test_psum_over_a_vmap_axis": [{"taken": 1}, {"refused: vmap axis": 1}],
    "test_psum_of_groups": [{"taken": 1}, {"refused: argument axis_index_groups": 1}],
    "test_psum_with_an_argument_lax_does_not_take": [{"lax's error: arguments lax does not take": 1}],
    "test_jaxpr_names_psum": [{"taken": 1}],
    "test_wrong_reference_fails_with_lax_too": [{"taken": 1}],
}


def write_checkout(root: Path, version: str) -> Path:
    (root / "jax").mkdir(parents=True)
    (root / "jax" / "version.py").write_text(f'_version = "{version}"\n')
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--import-mode=importlib"\n')
    (root / "tests").mkdir()
    (root / "tests" / "collectives_test.py").write_text(COLLECTIVES_TEST)
    return root


def test_counts_calls_and_compares_outcomes(tmp_path):
    checkout = write_checkout(tmp_path / "jax", jax.__version__)
    summary_file = tmp_path / "summary.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--jax-tests", str(checkout), "collectives_test.py", "-n", "0",
         "--json", str(summary_file), "--logs", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(summary_file.read_text())
    by_test = {test.split("::")[-1]: calls for test, calls in summary["calls_by_test"].items()}

    # The calls a function of jax's own makes (traced twice) are lax's, counted apart; jaxring's error
    # for a call lax refuses too propagates, counted as raised.
    assert by_test.pop("test_psum_named_by_jax_code_stays_lax") == {"jax's own": 2}
    (raised,) = by_test.pop("test_psum_scatter_of_a_wrong_size").items()
    assert raised[0].startswith("raised: ValueError: ") and raised[1] == 1
    assert by_test.keys() == EXPECTED_CALLS.keys()
    for test, calls in by_test.items():
        assert calls in EXPECTED_CALLS[test], (test, calls)

    counts = summary["calls"]
    outcomes = [outcome.split(":")[0] for calls in summary["calls_by_test"].values() for outcome in calls]
    assert counts["taken"] == outcomes.count("taken") >= 7
    assert counts["refused"] == outcomes.count("refused") == sum(counts["refused_by_reason"].values()) >= 1
    assert counts["refused_by_reason"].get("vmap axis in a tuple of a gather or scatter") == 1
    assert (counts["raised"], counts["lax_errors"], counts["left_to_lax_as_jax_own"]) == (1, 1, 2)
    assert counts["total"] == counts["taken"] + counts["refused"] + counts["raised"] == 12

    # Every refused call fell back to lax and every taken one matched numpy: the tests pass alike, but
    # for the one that reads lax's primitive in the jaxpr and the one whose reference is wrong.
    tests = summary["tests"]
    assert tests["baseline"] == {"passed": 13, "failed": 1}
    assert tests["rebound"] == {"passed": 12, "failed": 2}
    assert tests["baseline_to_rebound"] == {"passed -> passed": 12, "passed -> failed": 1, "failed -> failed": 1}
    (only_rebound,) = tests["failed_only_rebound"].items()
    assert only_rebound[0].endswith("::test_jaxpr_names_psum") and "psum" in only_rebound[1]
    assert "taken by jaxring" in run.stdout and "test_jaxpr_names_psum" in run.stdout


def test_refuses_a_checkout_of_another_version(tmp_path):
    checkout = write_checkout(tmp_path / "jax", "0.0.1")
    with pytest.raises(SystemExit, match=rf"JAX 0\.0\.1's tests, the installed jax is {jax.__version__}.*"
                                         rf"git clone --depth 1 --branch jax-v{jax.__version__}"):
        lax_conformance.main(["--jax-tests", str(checkout)])


def test_refuses_a_directory_that_is_not_a_checkout(tmp_path):
    with pytest.raises(SystemExit, match="is not a checkout of JAX.*git clone"):
        lax_conformance.main(["--jax-tests", str(tmp_path)])
