"""jaxring.mpi4jax, mpi4jax's reductions by jaxring's leg, and a communicator's members reducing alone.

Two mpirun launches of collectives/mpi_workers/mpi4jax_drop_in.py (start-up costs seconds), each
with a timeout far below the default (300 s), so that a process waiting on others fails the test
instead of holding it up. The launch's own limit is looser: on the 2-core machine at a load of 35,
2026-12-03, the members_alone job's imports took 24 s of its 32 (the check itself 3 s).
"""

import pytest
from mpi4py import MPI

import jaxring.mpi4jax as drop_in
from tests.jaxring.collectives.test_mpi import assert_passed, run_workers


def test_a_communicators_members_alone_reduce_over_it():
    """4 processes, 2 of them reducing over their communicator while the other 2 wait for them."""
    output = run_workers("mpi4jax_drop_in.py", ["members_alone"], 4, 1, env={"JAXRING_TIMEOUT_S": "30"}, timeout_s=120)
    assert_passed(output, ["members_alone"], range(4))


def test_the_drop_in_matches_mpi4jax_and_numpy_across_two_processes():
    output = run_workers("mpi4jax_drop_in.py", ["drop_in"], 2, 1, env={"JAXRING_TIMEOUT_S": "30"}, timeout_s=120)
    assert_passed(output, ["drop_in"], range(2))


# --- one process: launched without mpirun, COMM_WORLD is this process ---------


def test_in_one_process_each_op_is_its_input():
    x = [[1.5, -2.0], [0.25, 3.0]]
    for op in (MPI.SUM, MPI.MAX, MPI.MIN):
        assert drop_in.allreduce(x, op).tolist() == x
    assert drop_in.allgather(x).tolist() == [x]
    assert drop_in.reduce(x, MPI.SUM, 0).tolist() == x


@pytest.mark.parametrize("op, name", [(MPI.PROD, "MPI.PROD"), (MPI.BOR, "MPI.BOR"), (MPI.MAXLOC, "MPI.MAXLOC")])
def test_an_op_the_ring_cannot_do_is_named_and_sent_to_mpi4jax(op, name):
    with pytest.raises(ValueError, match=f"{name}.*mpi4jax.allreduce"):
        drop_in.allreduce([1.0], op)
