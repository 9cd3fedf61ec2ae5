"""The cross-process leg over every dtype and op, over communicators split from the job, next to mpi4jax.

Two mpirun launches (mpi_workers/communicators.py, start-up costs seconds): 4 processes of one
device (every dtype x op over 2-process groups, the 2x2 split with mpi4jax in one queued program,
the refusals) and 2 processes of 2 devices (the job with a local ring, the cases it takes).
"""

import pytest

from tests.jaxring.collectives.test_mpi import assert_passed, run_workers

LAYOUTS = {
    (4, 1): ["matrix_in_groups", "with_mpi4jax_queued", "refusals"],
    (2, 2): ["matrix"],
}


@pytest.mark.parametrize("n_procs, devices_per_proc", list(LAYOUTS))
def test_every_dtype_and_op_over_communicators(n_procs, devices_per_proc):
    checks = LAYOUTS[n_procs, devices_per_proc]
    output = run_workers("communicators.py", checks, n_procs, devices_per_proc)
    assert_passed(output, checks, range(n_procs))
