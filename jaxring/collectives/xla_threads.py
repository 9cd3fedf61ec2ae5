"""Enough threads in XLA's CPU client for steps queued over several host devices.

XLA's CPU client runs each device's part of an execution on a thread of one
pool, sized max(cores, devices), and holds the thread until that part ends,
a collective's wait for its peers included; a device with its limit of
executions queued holds a launching thread too. When a loop queues steps
faster than they run (JAX's asynchronous dispatch), every thread of the pool
can end up waiting for a device whose execution has no thread left to start
on: jax.lax.psum hangs there as jaxring's collectives did (docs/USAGE.md,
"Steps in flight", measured on 2, 4 and 8 host devices of a 2-core machine).
XLA takes the pool's size from $NPROC, read when JAX makes the client; with
THREADS_PER_DEVICE threads per host device no queued loop measured there
waited. jaxring sets $NPROC so unless the user set it (which it respects).
$NPROC also sizes XLA's intra-op (Eigen) pool, which computes every device's
operations: each thread past the cores costs compute time, so the count is
the least that ran every queued loop of tests/jaxring/collectives/
test_queued_steps.py (2 per device passed on 2, 4 and 8 devices; 1 hangs).
"""

import os
import re
import warnings

from jaxring.collectives import _jax_compat

THREADS_PER_DEVICE = 2
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def host_devices_in(xla_flags: str) -> int:
    """The host devices `xla_flags` asks XLA's CPU client for (the last setting wins; 1 when none)."""
    counts = _DEVICE_COUNT_FLAG.findall(xla_flags)
    return int(counts[-1]) if counts else 1


def reserve_client_threads(host_devices: int | None = None) -> bool:
    """Sets $NPROC to THREADS_PER_DEVICE threads per host device (`host_devices`, else what $XLA_FLAGS
    asks for) or the cores, whichever is more; False, changing nothing, where the user set $NPROC, there
    is one host device, or JAX has already made its clients (then warning where they are short of threads)."""
    if "NPROC" in os.environ:
        return False
    if _jax_compat.backends_started():
        _warn_if_short_of_threads()
        return False
    if host_devices is None:
        host_devices = host_devices_in(os.environ.get("XLA_FLAGS", ""))
    if host_devices <= 1:
        return False
    os.environ["NPROC"] = str(max(os.cpu_count() or 1, THREADS_PER_DEVICE * host_devices))
    return True


def _warn_if_short_of_threads() -> None:
    """One warning where JAX's CPU client, made before jaxring was imported, has fewer threads than
    steps queued over its devices need: the hang it risks comes only after the collective's timeout."""
    import jax

    try:
        devices = len(jax.devices("cpu"))
    except RuntimeError:  # no CPU client: nothing to warn about
        return
    cores = os.cpu_count() or 1
    if devices <= 1 or max(cores, devices) >= THREADS_PER_DEVICE * devices:
        return
    warnings.warn(
        f"jaxring was imported after JAX made its CPU client, whose pool has {max(cores, devices)} threads for "
        f"{devices} host devices: steps queued over them (a loop that does not wait for each step) can hold every "
        "thread in a collective's wait and stall until the collective times out, with jax.lax.psum as with "
        "jaxring (docs/USAGE.md, 'Steps in flight'). Import jaxring before JAX's first use of a device, or start "
        f"Python with NPROC={THREADS_PER_DEVICE * devices}.",
        stacklevel=3,
    )
