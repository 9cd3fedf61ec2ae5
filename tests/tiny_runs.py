"""scripts/train.py shrunk to seconds, and mpirun that never hangs: shared by tests/scripts and tests/faults."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ds2_tiny.yaml"
TRAIN = ROOT / "scripts" / "train.py"
MPIRUN = Path(sys.executable).parent / "mpirun"


def tiny_overrides(cache_dir, batch_size=8, **values):
    """ds2_tiny shrunk to seconds: 1 conv, one 8-unit GRU, 30 utterances, one padded shape; `values` on top.

    One shape, so the training step compiles once: the corpus' transcripts are 8 to 22 characters, and
    the default pad_labels_to (16) gave batches of 16 or 32 labels, a second compile (27 s of a 90 s
    mpirun run on 2 loaded cores)."""
    values = {
        "model.conv_layers": 1,
        "model.conv_channels": "[2]",
        "model.rnn_layers": 1,
        "model.rnn_hidden": 8,
        "data.cache_dir": cache_dir,
        "data.utterances": 30,
        "data.pad_frames_to": 320,
        "data.pad_labels_to": 32,
        "train.batch_size": batch_size,
        "train.epochs": 1,
        "train.log_every": 1,
        "eval.every_steps": 2,
        "eval.batch_size": 8,
        "eval.max_examples": None,
        "checkpoint.every_steps": 1,
        **values,
    }
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={'null' if value is None else value}")]


# Open MPI's fault tolerance: a dead process is reported to the others as an MPI error naming it.
ULFM = ("--with-ft", "ulfm")


def mpirun(n_procs, script_and_args, env=(), with_mpi4py=False, devices_per_proc=2, mpirun_args=()):
    """The Popen of `mpirun [MPIRUN_ARGS] -np N python [-m mpi4py] SCRIPT ARGS`, in a session of its own, output piped."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    environment.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_proc}",
                       **dict(env))
    # Waiting ranks yield the core: the test machine has fewer cores than ranks.
    command = [str(MPIRUN), "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    command += [*mpirun_args, "-np", str(n_procs)]
    for name in ["JAX_PLATFORMS", "XLA_FLAGS", *dict(env)]:
        command += ["-x", name]
    command += [sys.executable, *(["-m", "mpi4py"] if with_mpi4py else []), *map(str, script_and_args)]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process, timeout_s):
    """(return code, output) of `process`, or (None, output) after killing its session at `timeout_s`."""
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return None, process.communicate()[0]


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
