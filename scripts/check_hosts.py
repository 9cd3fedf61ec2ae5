"""Checks the hosts of an MPI job before training: one tiny all-reduce across every process, each host named.

    mpirun --hostfile hosts.txt -np 2 --npernode 1 python -m mpi4py scripts/check_hosts.py

Every process joins the job (jaxring.init) and sums, through jaxring's MPI leg
in a compiled program (the path training takes), a value that differs between
devices; rank 0 prints one line per process (rank, host name, devices, the
Python and jaxring it runs) and whether the sum was right, and says what differs
between hosts where their Python, jaxring checkout or JAX differ (docs/MULTI_NODE.md
says what must be the same). Exit status 0 only when the sum is right on every
process and nothing differs. A host that cannot be reached ends the job with
Open MPI's or jaxring's error naming it, within the timeout (--timeout).
"""

import argparse
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxring.collectives.abort import abort_on_uncaught_exception, start_mpi  # noqa: E402
from jaxring.engine.progress import counted  # noqa: E402


def what_must_match() -> dict[str, str]:
    """What this process runs, that every host must run the same of (docs/MULTI_NODE.md)."""
    import jax

    import jaxring

    return {"python": sys.executable, "jaxring": str(Path(jaxring.__file__).resolve().parent), "jax": jax.__version__}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every process (default 60)")
    args = parser.parse_args(argv)
    start_mpi()
    abort_on_uncaught_exception()
    import jax
    import numpy as np

    import jaxring

    jaxring.set_default_timeout(args.timeout)
    world = jaxring.init()
    n_local = len(world.local_devices)
    # Device d of rank r holds r * n_local + d + 1: the sum over every device is n (n + 1) / 2.
    values = np.arange(1, n_local + 1, dtype=np.float32)[:, None] + world.rank * n_local
    total = float(np.asarray(jax.device_get(jaxring.global_allreduce(values, "sum")))[0, 0])
    expected = world.n_devices * (world.n_devices + 1) / 2
    platform = world.local_devices[0].platform
    mine = {"rank": world.rank, "host": socket.gethostname(), "devices": counted(n_local, f"{platform} device"),
            "sum_right": total == expected, **what_must_match()}
    everyone = world.comm.gather(mine, root=0)
    if world.rank != 0:
        return 0 if mine["sum_right"] else 1
    for process in everyone:
        print(f"rank {process['rank']} on {process['host']}: {process['devices']}, "
              f"python {process['python']}, jaxring {process['jaxring']}, jax {process['jax']}", flush=True)
    wrong = [p for p in everyone if not p["sum_right"]]
    differing = [key for key in what_must_match() if len({p[key] for p in everyone}) > 1]
    hosts = sorted({p["host"] for p in everyone})
    print(f"all-reduce over {counted(world.size, 'process')} on {counted(len(hosts), 'host')} ({', '.join(hosts)}), "
          f"{counted(world.n_devices, 'device')}: " + ("right" if not wrong else
                                            "WRONG on " + ", ".join(f"rank {p['rank']} ({p['host']})" for p in wrong)))
    for key in differing:
        print(f"differs between hosts: {key}: "
              + "; ".join(f"rank {p['rank']} ({p['host']}) {p[key]}" for p in everyone), flush=True)
    return 1 if wrong or differing else 0


if __name__ == "__main__":
    sys.exit(main())
