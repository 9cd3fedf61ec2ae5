"""The cross-process leg over every dtype and op, over communicators split from the job, next to mpi4jax.

Two mpirun launches (mpi_workers/communicators.py, start-up costs seconds): 2 processes of 2
devices (every dtype x op through the local ring and the leg, both of the leg's algorithms; float
max/min from one device per process, so that NaNs reach the leg) and 4 processes of one device
(the 2x2 split with mpi4jax in one queued program, the refusals).
"""

import pytest

from tests.jaxring.collectives.test_mpi import assert_passed, run_workers

LAYOUTS = {
    (4, 1): ["with_mpi4jax_queued", "refusals"],
    (2, 4): ["groups", "vmap_axes", "matrix", "nans_on_one_device"],
}


@pytest.mark.parametrize("n_procs, devices_per_proc", list(LAYOUTS))
def test_every_dtype_and_op_over_communicators(n_procs, devices_per_proc):
    checks = LAYOUTS[n_procs, devices_per_proc]
    output = run_workers("communicators.py", checks, n_procs, devices_per_proc)
    assert_passed(output, checks, range(n_procs))
