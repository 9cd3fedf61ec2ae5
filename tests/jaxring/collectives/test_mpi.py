"""global_allreduce, broadcast and the replica checks, in one process and under mpirun.

The multi-process checks live in mpi_workers/; each layout is one mpirun
launch (start-up costs seconds) running all of them.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxring.collectives import mpi, timeout, topology

WORKERS = pathlib.Path(__file__).with_name("mpi_workers")
MPIRUN = pathlib.Path(sys.executable).parent / "mpirun"
CHECKS = ["topology", "allreduce", "mean_and_auto", "int32_and_pytrees", "mismatch", "broadcast_and_replicas", "host_leaf_divergence"]


def mpirun(worker, args, n_procs, devices_per_proc, env=(), timeout_s=150):
    """Runs `python -m mpi4py worker args` on n_procs ranks; returns the output. Never hangs."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    environment.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_proc}",
        **dict(env),
    )
    # Waiting ranks yield the core: the test machine has fewer cores than ranks.
    command = [str(MPIRUN), "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    command += ["-np", str(n_procs)]
    for name in ["JAX_PLATFORMS", "XLA_FLAGS", *dict(env)]:
        command += ["-x", name]
    command += [sys.executable, "-m", "mpi4py", str(WORKERS / worker), *args]
    # A session of its own, so that a stuck job can be killed with all its ranks.
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"mpirun did not finish within {timeout_s} s:\n{output}")
    assert process.returncode == 0, output
    return output


def assert_passed(output, checks, ranks):
    for check in checks:
        for rank in ranks:
            assert f"PASS rank {rank} {check}\n" in output, f"rank {rank} did not pass {check}:\n{output}"


@pytest.mark.parametrize("n_procs, devices_per_proc", [(2, 4), (3, 2), (4, 1)])
def test_collectives_across_processes(n_procs, devices_per_proc):
    output = mpirun("collectives.py", CHECKS, n_procs, devices_per_proc)
    assert_passed(output, CHECKS, range(n_procs))


def test_a_process_that_never_arrives_times_out_the_others():
    output = mpirun("straggler.py", [], 3, 1, env={"JAXRING_TIMEOUT_S": "2"})
    assert_passed(output, ["straggler"], [0, 2])


# --- one process: launched without mpirun, the world is this process ---------


def test_world_of_one():
    world = topology.init()
    assert (world.rank, world.size, world.local_rank, world.local_size) == (0, 1, 0, 1)
    assert world.local_devices == tuple(jax.local_devices())
    assert world.n_devices == len(jax.local_devices())
    assert topology.init() is world


@pytest.mark.parametrize("algorithm", mpi.ALGORITHMS)
@pytest.mark.parametrize("shape", [(5,), (3, 7)])
def test_one_process_is_the_local_allreduce(algorithm, shape):
    n = len(topology.init().local_devices)
    x = np.random.default_rng(0).standard_normal((n, *shape)).astype(np.float32)
    want = x.astype(np.float64).sum(0)
    total = np.asarray(mpi.global_allreduce(x, algorithm=algorithm))
    mean = np.asarray(mpi.global_allreduce(x, op="mean", algorithm=algorithm))
    np.testing.assert_allclose(total, np.broadcast_to(want, x.shape), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, np.broadcast_to(want / n, x.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ("ring", "mpi"))
def test_one_process_int32_is_exact_and_pytrees_go_leaf_by_leaf(algorithm):
    n = len(topology.init().local_devices)
    rng = np.random.default_rng(1)
    tree = {"ints": rng.integers(-(2**20), 2**20, (n, 6, 5)).astype(np.int32), "more": [rng.standard_normal((n, 3)).astype(np.float32)]}
    out = mpi.global_allreduce(tree, algorithm=algorithm)
    assert out["ints"].dtype == np.int32
    assert (np.asarray(out["ints"]) == tree["ints"].astype(np.int64).sum(0)).all()
    np.testing.assert_allclose(out["more"][0], np.broadcast_to(tree["more"][0].astype(np.float64).sum(0), (n, 3)), rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(x=np.zeros((3, 2), np.float32)), ValueError, "leading axis of 8"),
        (dict(x=np.zeros((8, 2), np.uint8)), TypeError, "float32, bfloat16, float16, int32"),
        (dict(x=np.zeros((8, 2), np.float32), timeout="5"), TypeError, "positive number"),
        (dict(x=np.zeros((8, 2), np.float32), op="max"), ValueError, "op must be"),
        (dict(x=np.zeros((8, 2), np.float32), algorithm="nccl"), ValueError, "algorithm must be"),
        (dict(x=np.zeros((8, 2), np.float32), timeout=0), ValueError, "positive number"),
    ],
)
def test_bad_arguments_are_explained(kwargs, error, words):
    with pytest.raises(error, match=words):
        mpi.global_allreduce(**kwargs)


def test_calling_inside_jit_is_explained():
    with pytest.raises(TypeError, match="runs outside jit"):
        jax.jit(mpi.global_allreduce)(np.zeros((8, 2), np.float32))


def test_bad_timeout_variable_is_explained(monkeypatch):
    monkeypatch.setattr(timeout, "_default_s", None)  # as if the variable were read for the first time
    monkeypatch.setenv("JAXRING_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="JAXRING_TIMEOUT_S must be a positive number"):
        mpi.global_allreduce(np.zeros((8, 2), np.float32))


def test_auto_follows_the_nearest_measurement(tmp_path, monkeypatch):
    table = tmp_path / "table.json"
    table.write_text(
        json.dumps(
            {
                "measured": [
                    {"n_procs": 2, "bytes": 1024, "fastest": "mpi"},
                    {"n_procs": 2, "bytes": 1 << 20, "fastest": "ring"},
                    {"n_procs": 4, "bytes": 1024, "fastest": "ring"},
                ]
            }
        )
    )
    monkeypatch.setattr(mpi, "TABLE_PATH", table)
    mpi._table.cache_clear()
    try:
        assert mpi.choose_algorithm(2000, 2) == "mpi"
        assert mpi.choose_algorithm(4 << 20, 2) == "ring"
        assert mpi.choose_algorithm(2000, 5) == "ring"  # nearest process count first
        monkeypatch.setattr(mpi, "TABLE_PATH", tmp_path / "absent.json")
        mpi._table.cache_clear()
        assert mpi.choose_algorithm(mpi.DEFAULT_RING_MIN_BYTES - 1, 2) == "mpi"
        assert mpi.choose_algorithm(mpi.DEFAULT_RING_MIN_BYTES, 2) == "ring"
    finally:
        mpi._table.cache_clear()
