"""jaxring.allreduce(processes=True), broadcast and the replica checks, in one process and under mpirun.

The multi-process checks live in mpi_workers/; each layout of collectives.py
is one mpirun launch (start-up costs seconds) running every check of that
layout, whose output the tests of that layout share.
"""

import functools
import pathlib
import time

import jax
import numpy as np
import pytest

import jaxring
from jaxring.collectives import global_ops, timeout, topology
from tests.tiny_runs import finish, mpirun

WORKERS = pathlib.Path(__file__).with_name("mpi_workers")
CHECKS = ["topology", "allreduce", "algorithms", "mean_and_jit_and_shard_map", "sync", "mismatch", "broadcast_and_replicas",
          "host_leaf_divergence", "equal_legs", "queued"]
# Every kind of operand lax takes (operand_kinds.py) compiles some forty legs: two layouts, not all four;
# the leg's phases alone (ShardedUpdate's) need only two and three processes. ShardedUpdate's queued adamw
# steps against the replicated update (gpu_check.sh part 2 runs it on a GPU) and tree_allreduce's wire
# dtype: one layout, for their compile time. The queued steps (0.5-1 s a layout) run in every layout: one
# device a process (the smallest XLA pool) in 2x1, three processes in 3x2.
LAYOUTS = {
    (2, 1): CHECKS,
    (2, 2): CHECKS + ["operand_kinds", "phases", "sharded_steps", "tree_wire_dtype"],
    (2, 3): CHECKS,
    (3, 2): CHECKS + ["operand_kinds", "phases"],
}


def run_workers(worker, args, n_procs, devices_per_proc, env=(), timeout_s=240):
    """The output of `mpirun -np N python -m mpi4py WORKER ARGS`, which must succeed. Never hangs."""
    code, output = finish(mpirun(n_procs, [WORKERS / worker, *args], env, True, devices_per_proc), timeout_s)
    assert code is not None, f"mpirun did not finish within {timeout_s} s:\n{output}"
    assert code == 0, output
    return output


@functools.cache
def collectives_output(n_procs, devices_per_proc):
    """(exit code, output) of collectives.py running every check of the layout (LAYOUTS): one launch, whose
    outcome, a failure too, every test of the layout reads."""
    try:
        return 0, run_workers("collectives.py", LAYOUTS[n_procs, devices_per_proc], n_procs, devices_per_proc)
    except AssertionError as error:
        return 1, str(error)


def assert_collectives_passed(checks, n_procs, devices_per_proc):
    code, output = collectives_output(n_procs, devices_per_proc)
    assert code == 0, output
    assert_passed(output, checks, range(n_procs))


def assert_passed(output, checks, ranks):
    for check in checks:
        for rank in ranks:
            assert f"PASS rank {rank} {check}\n" in output, f"rank {rank} did not pass {check}:\n{output}"


@pytest.mark.parametrize("n_procs, devices_per_proc", LAYOUTS)
def test_collectives_across_processes(n_procs, devices_per_proc):
    assert_collectives_passed(LAYOUTS[n_procs, devices_per_proc], n_procs, devices_per_proc)


@pytest.mark.parametrize("n_procs, devices_per_proc", LAYOUTS)
def test_queued_steps_across_processes(n_procs, devices_per_proc):
    assert_collectives_passed(["queued"], n_procs, devices_per_proc)


def test_tree_allreduce_crosses_in_the_wire_dtype_as_allreduce_does():
    assert_collectives_passed(["tree_wire_dtype"], 2, 2)


def test_a_process_that_never_arrives_times_out_the_others():
    output = run_workers("straggler.py", [], 3, 1, env={"JAXRING_TIMEOUT_S": "2"})
    assert_passed(output, ["straggler"], [0, 2])


def test_tiny_legs_over_four_processes_go_by_recursive_doubling_and_time_out_naming_a_rank():
    output = run_workers("doubling.py", [], 4, 1)
    assert_passed(output, ["doubling"], range(4))
    assert_passed(output, ["doubling_timeout"], range(3))


def test_processes_that_arrive_late_hand_legs_to_task_threads_and_sum_right():
    output = run_workers("late_peers.py", [], 3, 1)
    assert_passed(output, ["late_peers"], range(3))


def test_a_process_that_leaves_mpi_after_its_legs_holds_up_no_other(tmp_path):
    """4 processes, 16 MiB legs, a wait outside MPI after each program (mpi_workers/leaves_mpi.py).

    Without the legs' farewells a process was left waiting for its sends to be
    taken in about one launch in three (`rank 2 of 4 waited 10 s for a chunk
    to be taken; no answer from rank 3`): the failure is one of timing, so
    this catches their loss often, not always.
    """
    output = run_workers("leaves_mpi.py", [tmp_path, 1 << 22, 12], 4, 1, env={"JAXRING_TIMEOUT_S": "15"})
    assert_passed(output, ["leaves_mpi"], range(4))


def test_a_process_that_leaves_mpi_after_a_leg_without_farewells_holds_up_no_other(tmp_path):
    """As above with legs of 12 KB, by recursive doubling, which ends without farewells: its
    messages are pieces of at most csrc/mpi/mpi_host_ring.cc's kEagerPieceBytes, whose sends
    are eager, so no process waits on one that left MPI."""
    output = run_workers("leaves_mpi.py", [tmp_path, 3001, 12], 4, 1, env={"JAXRING_TIMEOUT_S": "15"})
    assert_passed(output, ["leaves_mpi"], range(4))


# --- one process: launched without mpirun, the world is this process ---------


def test_world_of_one():
    world = topology.init()
    assert (world.rank, world.size, world.local_rank, world.local_size) == (0, 1, 0, 1)
    assert world.local_devices == tuple(jax.local_devices())
    assert world.n_devices == len(jax.local_devices())
    assert topology.init() is world


@pytest.mark.parametrize("shape", [(5,), (3, 7)])
def test_one_process_is_the_local_allreduce(shape):
    n = len(topology.init().local_devices)
    x = np.random.default_rng(0).standard_normal((n, *shape)).astype(np.float32)
    local = jax.pmap(lambda v: jaxring.allreduce(v, "i"), "i")(x)
    across = jax.pmap(lambda v: jaxring.allreduce(v, "i", processes=True), "i")(x)
    assert np.asarray(across).tobytes() == np.asarray(local).tobytes()
    mean = np.broadcast_to(x.astype(np.float64).mean(0), x.shape)
    np.testing.assert_allclose(np.asarray(global_ops.global_allreduce(x, op="mean")), mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(x=np.zeros((3, 2), np.float32)), ValueError, "leading axis of 8"),
        (dict(x=np.zeros((8, 2), np.float32), timeout="5"), TypeError, "positive number"),
        (dict(x=np.zeros((8, 2), np.float32), op="prod"), ValueError, "op must be"),
        (dict(x=np.zeros((8, 2), np.float32), timeout=0), ValueError, "positive number"),
    ],
)
def test_bad_arguments_are_explained(kwargs, error, words):
    with pytest.raises(error, match=words):
        global_ops.global_allreduce(**kwargs)


def test_bad_timeout_variable_is_explained(monkeypatch):
    monkeypatch.setattr(timeout, "_default_s", None)  # as if the variable were read for the first time
    monkeypatch.setenv("JAXRING_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="JAXRING_TIMEOUT_S must be a positive number"):
        global_ops.global_allreduce(np.zeros((8, 2), np.float32))


@pytest.mark.parametrize("n_procs, devices_per_proc", [(2, 1), (3, 2)])
def test_jax_distributed_axis_spanning_processes_works_as_processes_true(n_procs, devices_per_proc):
    output = run_workers("distributed.py", [], n_procs, devices_per_proc)
    assert_passed(output, ["distributed"], range(n_procs))


def test_jax_distributed_process_ids_other_than_mpi_ranks_are_refused():
    output = run_workers("distributed.py", ["swapped"], 2, 2)
    assert_passed(output, ["distributed-swapped"], range(2))


@pytest.mark.parametrize("with_mpi4py", [False, True], ids=["python", "python -m mpi4py"])
def test_a_process_failing_under_jax_distributed_ends_the_job_at_once(with_mpi4py):
    """initialize_jax_distributed makes an uncaught exception end the job (abort.py). Before, the failing
    process waited at exit in JAX's shutdown barrier while the other waited in a leg for it (300 s each)."""
    start = time.monotonic()
    launch = mpirun(2, [WORKERS / "distributed.py", "failing"], {"JAXRING_TIMEOUT_S": "600"}, with_mpi4py, 2)
    code, output = finish(launch, timeout_s=240)
    assert code not in (None, 0), output
    assert "rank 1 fails on purpose" in output and "was not ended" not in output, output
    assert time.monotonic() - start < 120, output


def test_a_world_of_one_reports_no_failed_process():
    """abort.py's fault-tolerance path stays out of the way where MPI reports no failure."""
    from mpi4py import MPI

    from jaxring.collectives import abort

    assert abort.failed_ranks() == []
    assert abort.process_failure(ValueError("not MPI's")) is None
    assert abort.process_failure(MPI.Exception(MPI.ERR_OTHER)) is None
