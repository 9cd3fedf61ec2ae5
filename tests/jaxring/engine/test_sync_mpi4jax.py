"""train.across_processes mpi4jax (jaxring/engine/sync_mpi4jax.py): the Trainer's step against jaxring's path
under mpirun, the same bits on every process, steps that queue while a process is late, and a stopped
process ends the job (step_watchdog.py)."""

import re
from pathlib import Path

import pytest

from jaxring.engine import sync as sync_lib
from jaxring.engine.sync_mpi4jax import sync_for
from tests.tiny_runs import finish, mpirun

WORKER = Path(__file__).with_name("across_worker.py")
# After 50 steps from the same state: float32 averages differ only in the order of their additions
# (2.6e-7 of the weights' magnitude seen with 3 x 2); a 16-bit wire rounds each process' share
# (2.9e-3 seen with bfloat16 on 2 x 2 before it moved to 3 x 2, where jaxring's own bfloat16 wire rounds differently).
TOLERANCE = {"jaxring": 0, "mpi4jax": 1e-5, "mpi4jax:bfloat16": 2e-2}  # jaxring: the reference itself


def test_one_process_has_nothing_to_cross():
    """With one process no mean crosses processes: the setting changes nothing, and needs no MPI."""
    sync = sync_for(1, "ring", bucket_bytes=64, across_processes="mpi4jax")
    assert type(sync) is sync_lib.Sync and sync.across_processes == "jaxring"


@pytest.mark.parametrize("n_procs,n_devices,labels", [(2, 1, ["mpi4jax"]), (3, 2, ["mpi4jax", "mpi4jax:bfloat16"])],
                         ids=["2x1", "3x2"])
def test_mpi4jax_path_trains_as_jaxrings_with_the_same_bits_everywhere(n_procs, n_devices, labels):
    code, output = finish(mpirun(n_procs, [WORKER, "jaxring", *labels], with_mpi4py=True,
                                 devices_per_proc=n_devices), 240)
    assert code == 0, output  # the worker asserts every process' weights are the same bits
    for label in ["jaxring", *labels]:
        for rank in range(n_procs):
            found = re.search(rf"^rank {rank} {label} (\S+)( ahead (True|False))?$", output, re.MULTILINE)
            assert found, f"rank {rank} printed nothing for {label}:\n{output}"
            assert float(found[1]) <= TOLERANCE[label], (label, rank, found[1])
            # process 0's loop dispatched steps 2-5 while step 2 waited for the others: the steps queue
            assert found[3] == ("True" if rank == 0 else None), (label, rank, found[0])


@pytest.mark.parametrize("how", ["sleep"])  # stopped_rank_worker.py's "exit": mpirun ends that job by itself
def test_a_process_that_stops_ends_the_job(how):
    """mpi4jax waits forever for a peer: the job still ends (finish() kills it at 240 s and returns None)."""
    code, output = finish(mpirun(2, [WORKER.with_name("stopped_rank_worker.py"), how], with_mpi4py=True,
                                 devices_per_proc=2, env={"JAXRING_TIMEOUT_S": "4"}), 240)
    assert code not in (None, 0), output
    assert "rank 1 stops" in output and "finished 50 steps" not in output, output
    if how == "sleep":  # rank 0's watchdog names what happened
        assert re.search(r"rank 0: a training step has not finished in 4 s \(JAXRING_TIMEOUT_S\): "
                         r"train.across_processes is mpi4jax", output), output
