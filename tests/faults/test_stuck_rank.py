"""A rank stopped (SIGSTOP) under mpirun: the job ends within the timeout.

The waiting rank raises a TimeoutError naming the stopped one, and the job is
aborted rather than left waiting: in the middle of the exchange across
processes, under both launch forms (`mpirun python X.py` and `mpirun python -m
mpi4py X.py`), and at a random moment of scripts/train.py.
"""

import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.tiny_runs import CONFIG, TRAIN, ULFM, finish, mpirun, rank_pid, tiny_overrides

TIMEOUT_S = 3
# The roll call after the timeout (up to TIMEOUT_S), the abort and mpirun's teardown on a
# shared 2-core machine.
MARGIN_S = 45


def assert_ends_in_time(job, stopped: float, where: str) -> None:
    code, output = finish(job, TIMEOUT_S + MARGIN_S)
    assert code is not None, f"the job still ran {TIMEOUT_S + MARGIN_S} s after rank 1 stopped:\n{output}"
    assert code != 0 and time.monotonic() - stopped < TIMEOUT_S + MARGIN_S
    assert where in output and "no answer from rank 1 " in output, output
    assert "FAIL" not in output, output


@pytest.mark.parametrize("with_mpi4py", [False, True], ids=["python", "python -m mpi4py"])
def test_a_rank_stopped_in_the_exchange_ends_the_job_within_the_timeout(with_mpi4py):
    worker = Path(__file__).with_name("stopping_worker.py")
    job = mpirun(2, [worker], env={"JAXRING_TIMEOUT_S": str(TIMEOUT_S)}, with_mpi4py=with_mpi4py)
    started = time.monotonic()  # rank 1 stops itself once the job is up: the margin covers the start too
    assert_ends_in_time(job, started, "jaxring.allreduce across processes (sum of float32[1001]")


@pytest.mark.parametrize("n_procs, algorithm", [(3, "one-shot"), (3, "ring"), (3, "barrier"), (2, "ring")])
def test_a_rank_killed_in_the_exchange_is_named_at_once_under_ulfm(n_procs, algorithm):
    """Launched with Open MPI's fault tolerance, MPI tells the waiting ranks which process died: no timeout to wait out.

    In the leg (either algorithm), jaxring's error names it; in a collective of
    mpi4py's, the line abort_on_uncaught_exception adds.
    """
    worker = Path(__file__).with_name("stopping_worker.py")
    timeout_s = 120  # far longer than the job may take: the failure must be reported, not timed out
    job = mpirun(n_procs, [worker, "KILL", algorithm], env={"JAXRING_TIMEOUT_S": str(timeout_s)}, with_mpi4py=True,
                 devices_per_proc=1, mpirun_args=ULFM)
    started = time.monotonic()
    code, output = finish(job, MARGIN_S)
    assert code is not None, f"the job still ran {MARGIN_S} s after rank 1 was killed:\n{output}"
    # non-zero also when the one process left ends the job (an MPI_Abort there made mpirun exit 0)
    assert code != 0 and time.monotonic() - started < MARGIN_S < timeout_s, output
    if algorithm != "barrier":
        assert "jaxring.allreduce across processes (sum of float32[1001]" in output, output
    assert "failed: rank 1 (the process, or its node, is gone)" in output, output
    assert "--resume" in output and "FAIL rank" not in output, output


def test_a_rank_of_train_py_stopped_at_a_random_moment_ends_the_job(corpus_cache, tmp_path):
    workdir = tmp_path / "run"
    args = ["--config", str(CONFIG), "--workdir", str(workdir)]
    # Many steps without checkpoints or evaluation: most of the time goes to steps and their exchanges.
    args += tiny_overrides(corpus_cache, **{"train.epochs": 1000, "eval.every_steps": 0, "checkpoint.every_steps": 0})
    job = mpirun(2, [TRAIN, *args], env={"JAXRING_TIMEOUT_S": str(TIMEOUT_S)})
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 1):
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the job did not reach step 1:\n{finish(job, 1)[1]}")
        time.sleep(0.1)
    time.sleep(random.uniform(0, 1))  # a step, its exchange, or between them
    pid = rank_pid(workdir, 1)
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGSTOP)
    assert_ends_in_time(job, time.monotonic(), "error: ")  # train.py: one line, then the abort
