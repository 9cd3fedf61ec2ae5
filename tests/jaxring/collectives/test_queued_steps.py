"""jaxring's collectives with many executions in flight, as a JAX training loop queues them.

Each scenario (queued_loops.py) queues 500 steps, chained or not, with values
that change per step and blocks only at the end, under pmap and shard_map,
with and without a lax collective in the same step, and beside a second
jaxring program; every value is checked against float64 numpy. Each device count
runs in a process of its own, under a deadline: a stall fails within
minutes at worst (each op's timeout is seconds), never hangs the suite. The
multi-process loops are in mpi_workers/ (test_mpi.py).
"""

import os
import subprocess
import sys

import pytest

from tests.tiny_runs import ROOT

STEPS = 500


def run_loops(n_devices, repeats, timeout_s=300):
    # Without NPROC: importing jaxring sizes XLA's CPU client for the devices (xla_threads.py).
    env = {k: v for k, v in os.environ.items() if k != "NPROC"}
    # Exactly the devices it uses: XLA's CPU client makes at least one thread per device.
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}")
    done = subprocess.run([sys.executable, "-m", "tests.jaxring.collectives.queued_loops", str(n_devices), str(STEPS),
                           str(repeats)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.count(f"queued {STEPS} steps on {n_devices} devices") == repeats, done.stdout


@pytest.mark.parametrize("n_devices, repeats", [(2, 1), (8, 1)])
def test_queued_steps_sum_each_steps_own_values(n_devices, repeats):
    run_loops(n_devices, repeats)


def test_queued_steps_on_a_loaded_machine():
    """A process spins meanwhile: the races these loops catch showed with the machine busy. One
    spinner, not one per core: on the 2-core test machine it about doubles the loop's time (its
    threads wait for a core) and the test takes 14-18 s of CPU; two spinners took 34-36 s, most of
    it from the suite's other tests."""
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run_loops(4, repeats=1)
    finally:
        load.kill()
        load.wait()
