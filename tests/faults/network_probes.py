"""Network faults on an emulated cluster (scripts/bench/cluster/cluster.py): each must end cleanly or not at all.

    .venv/bin/python tests/faults/network_probes.py [--trials 10] [--timeout 10] [--json OUT]

Each probe runs a job across 2 emulated nodes (1 Gbit/s links), injects one
fault and is classified:

  ended       every process exited, non-zero, within timeout + MARGIN_S of the
              fault, and the output names the unreachable rank
  correct     the job went on and finished with correct results
  late        ended, but after timeout + MARGIN_S
  cryptic     ended without naming the unreachable rank
  hang        still running at its limit (then the cluster is torn down)
  wrong       an all-reduce returned a wrong result (network_worker.py checks each)
  loss        a checkpoint written before the fault is unreadable, or --resume failed

Not a test (pytest does not collect it): --trials 10 takes many minutes;
tests/faults/test_network_faults.py runs two probes within the suite's budget.
Needs root and network namespaces (see `skip_reason`).
"""

import argparse
import contextlib
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench" / "cluster"))

from cluster import Cluster, interrupt_on_termination  # noqa: E402
from tests.faults.probes import report  # noqa: E402
from tests.tiny_runs import CONFIG, TRAIN, ULFM, tiny_overrides  # noqa: E402

WORKER = Path(__file__).with_name("network_worker.py")
RUN_CHECKED = ROOT / "scripts" / "run_checked.py"
# After the fault: the roll call naming the missing rank (up to the timeout), the
# abort, and the kernel giving up the cut-off daemon's connection (cluster.TCP_RETRIES2,
# about 13 s), on a shared 2-core machine.
MARGIN_S = 30
LIMIT_S = 300
# Emulated clusters share the machine's namespace list and its 2 cores: the tests that build them
# take this lock, so pytest-xdist's workers build them one after another and their fault margins
# and their checks that nothing is left behind hold. (pytest-xdist's --dist loadgroup would do it,
# but its groups are lost with pytest 9.2: it renames items through an attribute 9.2 no longer reads.)
CLUSTER_LOCK = Path(tempfile.gettempdir()) / "jaxring-tests-emulated-clusters.lock"
# Every cluster test of a run takes 3-4 minutes in all; a wait past this is a holder that hangs.
CLUSTER_LOCK_WAIT_S = 900
_held: dict = {}  # lock path -> [depth, open file] of this process


@contextlib.contextmanager
def one_cluster_at_a_time(lock: Path = CLUSTER_LOCK, wait_s: float = CLUSTER_LOCK_WAIT_S):
    """Holds `lock`; re-entrant within a process (a module's cluster may be up while the same
    worker runs another module's test, which then needs no second lock). TimeoutError after
    `wait_s` seconds of another process holding it."""
    if lock not in _held:
        file = open(lock, "a")
        try:
            _lock_within(file, lock, wait_s)
        except BaseException:
            file.close()
            raise
        _held[lock] = [0, file]
    _held[lock][0] += 1
    try:
        yield
    finally:
        _held[lock][0] -= 1
        if _held[lock][0] == 0:
            _held.pop(lock)[1].close()  # closing the file drops the lock


def _lock_within(file, lock: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock}: another process has held it for over {wait_s:g} s; `fuser {lock}` "
                                   "names it (a hung test of an earlier run?): end it, then run the tests again")
            time.sleep(0.2)


@pytest.fixture
def cluster_lock():
    """One test's hold of one_cluster_at_a_time."""
    with one_cluster_at_a_time():
        yield


def skip_reason() -> str | None:
    """Why an emulated cluster cannot be made here, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        with Cluster(1, tag="probe"):
            pass
    except (subprocess.CalledProcessError, RuntimeError) as e:
        return f"cannot make a network namespace here: {getattr(e, 'stderr', '') or e}"
    return None


def with_timeout(env: dict, timeout_s: int | None) -> dict:
    """`env` with JAXRING_TIMEOUT_S = `timeout_s`, or without it (jaxring's default) for None."""
    env.pop("JAXRING_TIMEOUT_S", None)
    if timeout_s is not None:
        env["JAXRING_TIMEOUT_S"] = str(timeout_s)
    return env


class Job:
    """mpirun across `cluster`, output to a file (a pipe would be held open by the cut-off node's daemon)."""

    def __init__(self, cluster, command, timeout_s: int | None, log: Path, mpirun_args=(), launcher=()):
        """timeout_s: JAXRING_TIMEOUT_S of the processes; None: jaxring's default. `launcher`: what runs
        mpirun (e.g. scripts/run_checked.py), or nothing."""
        # mpirun's own environment, not this process's: pytest runs the other tests on 8 host devices
        env = with_timeout({**os.environ, "JAX_PLATFORMS": "cpu",
                            "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, timeout_s)
        self._start([*launcher, *cluster.mpirun(command, env_names=["JAXRING_TIMEOUT_S"], env=env,
                                                 extra=mpirun_args)], env, timeout_s, log)

    @classmethod
    def of_command_line(cls, argv, env, timeout_s: int | None, log: Path, cwd=None) -> "Job":
        """A job whose mpirun line was written elsewhere (docs/MULTI_NODE.md's, run by
        tests/scripts/test_multi_node.py); `env` as mpirun's, JAXRING_TIMEOUT_S set from `timeout_s`."""
        job = cls.__new__(cls)
        job._start(argv, with_timeout(dict(env), timeout_s), timeout_s, log, cwd)
        return job

    def _start(self, argv, env, timeout_s, log, cwd=None):
        self.log, self.timeout_s = log, timeout_s
        with open(log, "w") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=env, cwd=cwd)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate, limit=LIMIT_S) -> bool:
        deadline = time.monotonic() + limit
        while self.process.poll() is None and time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def finish(self, limit) -> tuple[int | None, float]:
        """(exit code or None if still running after `limit` s, seconds it took)."""
        started = time.monotonic()
        while self.process.poll() is None and time.monotonic() - started < limit:
            time.sleep(0.1)
        return self.process.poll(), time.monotonic() - started


def what_still_runs(cluster, job) -> str:
    """After a hang: each node's processes, and where their threads wait (gdb's native stacks, where
    gdb is installed), written beside the job's log; a one-line summary returned."""
    summary, stacks = [f"mpirun {'still running' if job.process.poll() is None else 'exited'}"], []
    for index, node in enumerate(cluster.nodes):
        for pid, name in cluster.processes(index):
            summary.append(f"{node}: {name} ({pid})")
            if name.startswith("python") and shutil.which("gdb"):
                bt = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 16"],
                                    capture_output=True, text=True, timeout=120).stdout
                stacks.append(f"==== {node} {name} {pid}\n{bt}")
    where = job.log.with_suffix(".hang")
    where.write_text("\n".join(summary) + "\n\n" + "\n".join(stacks))
    last = (job.output().strip().splitlines() or [""])[-1]
    return "; ".join(summary) + f"; the output's last line {last!r} (stacks: {where})"


def end_after_fault(cluster, job, timeout_s: int) -> tuple[str, str]:
    """Waits for `job` to end after a fault on node 1, classified (classify_end); a hang says what still runs."""
    code, seconds = job.finish(timeout_s + MARGIN_S + 60)
    outcome, detail = classify_end(job, code, seconds, cluster.nodes[1])
    if code is None:
        detail += f": {what_still_runs(cluster, job)}"
    return outcome, detail


def classify_end(job, code, seconds, node: str, rank=1) -> tuple[str, str]:
    """The outcome of a job that had to end after a fault on `rank`'s node (hostname `node`).

    jaxring's timeout names the rank; where Open MPI ends the job first (a closed
    socket, a lost daemon) its message names the node's hostname instead, which
    counts as named too and is said in the detail.
    """
    output = job.output()
    if "WRONG" in output:
        return "wrong", next(line for line in output.splitlines() if "WRONG" in line)
    if code is None:
        return "hang", f"still running {seconds:.0f} s after the fault"
    named = any(said in output for said in (f"no answer from rank {rank}", f"failed: rank {rank}",
                                            f"rank {rank} with PID"))
    by_node = not named and any(f"{before}{node}{after}" in output for before, after in
                                (("peer: ", " "), ("on node ", "\n"), ("Remote host:   ", "\n")))
    if code == 0:
        if f"rank {rank} done" in output:
            return "correct", f"exit 0 after {seconds:.0f} s"
        return "silent", f"exit 0 after {seconds:.0f} s: {output.strip()[-400:]!r}"
    if seconds > job.timeout_s + MARGIN_S:
        return "late", f"ended {seconds:.0f} s after the fault (timeout {job.timeout_s} s)"
    if by_node:
        return "ended", f"ended {seconds:.1f} s after the fault, exit {code}, Open MPI naming node {node}"
    if not named:
        return "cryptic", f"ended {seconds:.1f} s after the fault, exit {code}: {output.strip()[-400:]!r}"
    return "ended", f"ended {seconds:.1f} s after the fault, exit {code}"


def worker_fault(tmp: Path, timeout_s: int, fault: str, rng: random.Random, mpirun_args=()) -> tuple[str, str]:
    """2 nodes, all-reduces of 1 MiB in a loop; `fault` ("cut", "node", "rank") on node 1 after a random number."""
    with Cluster(2, "1gbit") as cluster:
        job = Job(cluster, [sys.executable, str(WORKER), "100000", "262144"], timeout_s, tmp / f"{fault}.log",
                  mpirun_args)
        after = rng.randint(2, 20)
        if not job.wait_for(lambda: job.output().count("rank 0 iteration") >= after):
            return "cryptic", f"never reached iteration {after}: {job.output()[-300:]}"
        time.sleep(rng.uniform(0, 0.3))
        if fault == "cut":
            cluster.cut(1)
        else:
            kill_node(cluster, 1, rank_only=fault == "rank")
        outcome, detail = end_after_fault(cluster, job, timeout_s)
        return outcome, f"{detail} (fault after iteration {after})"


def kill_node(cluster, node: int, rank_only=False) -> None:
    """SIGKILL to the node's rank, and its daemon unless `rank_only`; the shell left is mpirun's rsh
    session (an ssh client's stand-in)."""
    victims = ("python",) if rank_only else ("python", "prted")
    for pid, name in cluster.processes(node):
        if name.startswith(victims):
            os.kill(pid, signal.SIGKILL)


def killed_in_training(tmp: Path, cache: Path, timeout_s: int, rng: random.Random, rank_only=False,
                            mpirun_args=()) -> tuple[str, str]:
    """train.py on 2 nodes launched through scripts/run_checked.py; node 1's daemon and rank (or its rank
    alone) killed after the first checkpoint. mpirun's own status may be 0 then (PRRTE): the launch's must not."""
    workdir = tmp / "killed"
    values = {"train.epochs": 40, "eval.every_steps": 0, "checkpoint.every_steps": 1}
    with Cluster(2, "1gbit") as cluster:
        job = Job(cluster, train_command(workdir, cache, **values), timeout_s, tmp / "killed.log",
                  mpirun_args, launcher=[sys.executable, str(RUN_CHECKED)])
        if not job.wait_for(lambda: any((workdir / "checkpoints").glob("*"))):
            return "cryptic", f"no checkpoint written: {job.output()[-300:]}"
        time.sleep(rng.uniform(0.0, 1.0))
        kill_node(cluster, 1, rank_only)
        outcome, detail = end_after_fault(cluster, job, timeout_s)
    said_zero = "exited with status 0, but no process printed a finished run's last line" in job.output()
    return outcome, detail + ("; mpirun's own status was 0, run_checked.py's 1" if said_zero else "")


def worker_runs_through(tmp: Path, name: str, timeout_s: int | None, floats: int, rate="1gbit",
                        late_s: float = 0.0) -> tuple[str, str]:
    """A job that must finish correctly: on a slow link, or with node 1 starting `late_s` late."""
    with Cluster(2, rate) as cluster:
        iterations = 3
        command = [sys.executable, str(WORKER), str(iterations), str(floats)]
        if late_s:
            command = ["sh", "-c", f'[ "$OMPI_COMM_WORLD_RANK" = 1 ] && sleep {late_s}; exec "$@"', "late", *command]
        job = Job(cluster, command, timeout_s, tmp / f"{name}.log")
        code, seconds = job.finish(LIMIT_S)
        output = job.output()
        ok = code == 0 and "WRONG" not in output and all(f"rank {r} done" in output for r in (0, 1))
        outcome = "hang" if code is None else ("correct" if ok else "wrong" if "WRONG" in output else "cryptic")
        return outcome, f"exit {code} after {seconds:.0f} s" + ("" if ok else f": {output.strip()[-200:]}")


def train_command(workdir: Path, cache: Path, *extra, **values) -> list[str]:
    return [sys.executable, "-m", "mpi4py", str(TRAIN), "--config", str(CONFIG), "--workdir", str(workdir),
            *tiny_overrides(cache, **values), *extra]


def different_config(tmp: Path, cache: Path, timeout_s: int) -> tuple[str, str]:
    """Node 1 runs train.py with another train.seed: the job must refuse, naming both values."""
    workdir = tmp / "seeds"
    with Cluster(2, "1gbit") as cluster:
        # One command for both ranks; the rank picks its seed.
        command = ["sh", "-c", 'exec "$@" --set train.seed=$OMPI_COMM_WORLD_RANK', "seed",
                   *train_command(workdir, cache)]
        job = Job(cluster, command, timeout_s, tmp / "seeds.log")
        code, seconds = job.finish(LIMIT_S)
    output = job.output()
    named = "train.seed=0" in output and "train.seed=1" in output
    if code is None:
        return "hang", f"still running after {seconds:.0f} s"
    return ("ended" if code != 0 and named else "cryptic"), f"exit {code} after {seconds:.0f} s"


def cut_mid_checkpoint(tmp: Path, cache: Path, timeout_s: int, rng: random.Random) -> tuple[str, str]:
    """Node 1's link cut as a checkpoint is written; then --resume on a fresh cluster must continue."""
    from jaxring.engine.checkpoint import CheckpointError, Checkpoints

    workdir = tmp / "checkpointed"
    values = {"train.epochs": 40, "eval.every_steps": 0, "checkpoint.every_steps": 1}
    checkpoints = workdir / "checkpoints"
    # A checkpoint is written every step, so a cut at a random moment after the
    # first one falls during or between writes (checkpoint.keep bounds the files).
    delay_s = rng.uniform(0.0, 2.0)
    with Cluster(2, "1gbit") as cluster:
        job = Job(cluster, train_command(workdir, cache, **values), timeout_s, tmp / "checkpoint.log")
        if not job.wait_for(lambda: any(checkpoints.glob("*"))):
            return "cryptic", f"no checkpoint written: {job.output()[-300:]}"
        time.sleep(delay_s)
        cluster.cut(1)
        outcome, detail = end_after_fault(cluster, job, timeout_s)
    written = Checkpoints(checkpoints).steps()
    try:
        for step in written:
            Checkpoints(checkpoints).read(step)
    except CheckpointError as e:
        return "loss", f"{detail}; checkpoint unreadable: {e}"
    with Cluster(2, "1gbit") as cluster:
        more = {**values, "train.max_steps": max(written, default=0) + 2}
        resumed = Job(cluster, train_command(workdir, cache, "--resume", **more),
                      timeout_s, tmp / "resume.log")
        code, _ = resumed.finish(LIMIT_S)
    after = Checkpoints(checkpoints).steps()
    if code != 0 or not after or not written or max(after) <= max(written):
        return "loss", f"{detail}; --resume: exit {code}, checkpoints {written} -> {after}"
    return outcome, f"{detail}; cut {delay_s:.2f} s after the first checkpoint, --resume went on from step {max(written)}"


def resume_is_bitwise(tmp: Path, cache: Path, timeout_s: int, nodes: int = 4, rate: str = "10gbit") -> tuple[str, str]:
    """train.py on `nodes` nodes stopped at step 2 and resumed to step 4 ends bitwise equal to one run to step 4."""
    import numpy as np

    from jaxring.engine.checkpoint import Checkpoints

    values = {"train.epochs": 40, "eval.every_steps": 0, "checkpoint.every_steps": 2}
    codes = []
    for workdir, steps in ((tmp / "straight", [4]), (tmp / "restarted", [2, 4])):
        for i, last in enumerate(steps):
            with Cluster(nodes, rate) as cluster:
                extra = ["--resume"] if i else []
                job = Job(cluster, train_command(workdir, cache, *extra, **{**values, "train.max_steps": last}),
                          timeout_s, tmp / f"{workdir.name}{i}.log")
                codes.append(job.finish(LIMIT_S)[0])
    if codes != [0, 0, 0]:
        return "cryptic", f"exit codes {codes}: {(tmp / 'restarted1.log').read_text(errors='replace')[-300:]}"
    (a, _), (b, _) = (Checkpoints(tmp / name / "checkpoints").read(4) for name in ("straight", "restarted"))
    leaves = [(np.asarray(x), np.asarray(y)) for x, y in zip(_leaves(a), _leaves(b))]
    same = len(leaves) > 0 and all(x.tobytes() == y.tobytes() for x, y in leaves)
    return ("correct" if same else "wrong"), f"{nodes} nodes at {rate}: step 4 {'bitwise equal' if same else 'DIFFERS'}"


def _leaves(tree):
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    return [tree]


PROBES = {
    "link cut mid-all-reduce": lambda tmp, cache, t, rng: worker_fault(tmp, t, "cut", rng),
    "node killed (daemon and rank, SIGKILL)": lambda tmp, cache, t, rng: worker_fault(tmp, t, "node", rng),
    "rank killed (SIGKILL)": lambda tmp, cache, t, rng: worker_fault(tmp, t, "rank", rng),
    "rank killed (SIGKILL), mpirun --with-ft ulfm": lambda tmp, cache, t, rng: worker_fault(tmp, t, "rank", rng, ULFM),
    "node killed (daemon and rank, SIGKILL), mpirun --with-ft ulfm": lambda tmp, cache, t, rng: worker_fault(
        tmp, t, "node", rng, ULFM),
    "node killed in training, launched through run_checked.py": killed_in_training,
    "rank killed in training, mpirun --with-ft ulfm": lambda tmp, cache, t, rng: killed_in_training(
        tmp, cache, t, rng, rank_only=True, mpirun_args=ULFM),
    "node started 5 s late": lambda tmp, cache, t, rng: worker_runs_through(tmp, "late", t, 262144, late_s=5),
    "link at 10 Mbit/s, 4 MiB, default timeout": lambda tmp, cache, t, rng: worker_runs_through(
        tmp, "slow", None, 1 << 20, rate="10mbit"),
    "node with a different train.seed": lambda tmp, cache, t, rng: different_config(tmp, cache, t),
    "link cut mid-checkpoint, then --resume": cut_mid_checkpoint,
    "4 nodes at 10 Gbit/s, stopped and resumed": lambda tmp, cache, t, rng: resume_is_bitwise(tmp, cache, t),
}
REPEATED = ("link cut mid-all-reduce", "node killed (daemon and rank, SIGKILL)", "rank killed (SIGKILL)",
            "rank killed (SIGKILL), mpirun --with-ft ulfm", "node killed (daemon and rank, SIGKILL), mpirun --with-ft ulfm",
            "node killed in training, launched through run_checked.py", "rank killed in training, mpirun --with-ft ulfm",
            "link cut mid-checkpoint, then --resume")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=1, help="repetitions of the link cuts and the node kill")
    parser.add_argument("--timeout", type=int, default=10, help="JAXRING_TIMEOUT_S of the jobs")
    parser.add_argument("--only", nargs="+", choices=list(PROBES), help="run these probes alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    parser.add_argument("--logs", type=Path, help="keep the jobs' output and run folders in this (existing) folder")
    args = parser.parse_args(argv)
    if reason := skip_reason():
        sys.exit(f"cannot run: {reason}")
    interrupt_on_termination()
    from models.deepspeech2.data import ensure_synthetic_corpus

    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxring_net_probes_") as scratch:
        tmp = args.logs or Path(scratch)
        cache = tmp / "cache"
        ensure_synthetic_corpus(str(cache), 30, 0)
        for name in args.only or PROBES:
            for trial in range(args.trials if name in REPEATED else 1):
                folder = Path(tempfile.mkdtemp(dir=tmp))
                started = time.monotonic()
                outcome, detail = PROBES[name](folder, cache, args.timeout, rng)
                rows.append({"probe": name, "trial": trial, "outcome": outcome, "detail": detail,
                             "seconds": round(time.monotonic() - started, 1)})
                print(f"{outcome:8} {name:45} {detail}", flush=True)
    report(rows, args.json, timeout_s=args.timeout, margin_s=MARGIN_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
