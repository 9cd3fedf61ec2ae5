"""A rank stopped (SIGSTOP) in the middle of training under mpirun: the job ends within the timeout.

Both launch forms, `mpirun python scripts/train.py` and `mpirun python -m mpi4py
scripts/train.py`: the waiting rank raises a TimeoutError naming the stopped one, and
the job is aborted rather than left waiting.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.tiny_runs import CONFIG, finish, tiny_overrides, train_under_mpirun

TIMEOUT_S = 3
# The roll call after the timeout (up to TIMEOUT_S), the abort and mpirun's teardown on a
# shared 2-core machine.
MARGIN_S = 45


def rank_pid(workdir: Path, rank: int) -> int | None:
    """The pid of the train.py process of MPI rank `rank` writing to `workdir`, if it is running."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(workdir).encode() in command and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environment:
            return int(entry.name)
    return None


@pytest.mark.parametrize("with_mpi4py", [False, True], ids=["python", "python -m mpi4py"])
def test_a_stopped_rank_ends_the_job_within_the_timeout(corpus_cache, tmp_path, with_mpi4py):
    workdir = tmp_path / "run"
    args = ["--config", str(CONFIG), "--workdir", str(workdir)]
    # Many steps without checkpoints or evaluation: most of the time goes to steps and their exchanges.
    args += tiny_overrides(corpus_cache, **{"train.epochs": 1000, "eval.every_steps": 0, "checkpoint.every_steps": 0})
    job = train_under_mpirun(2, args, env={"JAXRING_TIMEOUT_S": str(TIMEOUT_S)}, with_mpi4py=with_mpi4py)
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the job did not reach step 3:\n{finish(job, 1)[1]}")
        time.sleep(0.1)
    pid = rank_pid(workdir, 1)
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    code, output = finish(job, TIMEOUT_S + MARGIN_S)
    assert code is not None, f"the job still ran {TIMEOUT_S + MARGIN_S} s after rank 1 stopped:\n{output}"
    assert code != 0 and time.monotonic() - stopped < TIMEOUT_S + MARGIN_S
    assert "TimeoutError" in output and "no answer from rank 1 " in output, output
