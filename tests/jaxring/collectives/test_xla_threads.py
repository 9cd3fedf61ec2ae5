"""xla_threads.py: importing jaxring gives XLA's CPU client threads for the host devices, unless told."""

import contextlib
import os
import subprocess
import sys

import pytest

from jaxring.collectives import xla_threads

PRINT_NPROC = "import os, jaxring; print(os.environ.get('NPROC'))"


def nproc_after_import(env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "XLA_FLAGS")}
    env.update(JAX_PLATFORMS="cpu", **env_changes)
    done = subprocess.run([sys.executable, "-c", PRINT_NPROC], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("flags, devices", [("", 1), ("--xla_force_host_platform_device_count=3", 3),
                                            ("--xla_cpu_foo=1 --xla_force_host_platform_device_count=2 "
                                             "--xla_force_host_platform_device_count=5", 5)])
def test_host_devices_are_read_from_the_flags_as_xla_reads_them(flags, devices):
    assert xla_threads.host_devices_in(flags) == devices


def test_importing_jaxring_reserves_threads_per_host_device():
    expected = max(os.cpu_count(), xla_threads.THREADS_PER_DEVICE * 3)
    assert nproc_after_import({"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}) == str(expected)


def test_one_device_or_the_users_own_setting_is_left_alone():
    assert nproc_after_import({}) == "None"
    assert nproc_after_import({"XLA_FLAGS": "--xla_force_host_platform_device_count=3", "NPROC": "5"}) == "5"


def test_nothing_changes_once_jax_made_its_clients(monkeypatch):
    import jax

    jax.devices()  # the clients exist from here on
    monkeypatch.delenv("NPROC", raising=False)
    with pytest.warns(UserWarning, match="imported after JAX made its CPU client") if len(jax.devices("cpu")) > 1 \
            else contextlib.nullcontext():
        assert xla_threads.reserve_client_threads(8) is False and "NPROC" not in os.environ


IMPORT_LATE = "import jax; jax.devices(); import jaxring"


@pytest.mark.parametrize("devices, nproc, warned", [(4, None, True), (4, "16", False), (1, None, False)])
def test_importing_jaxring_after_jax_made_its_client_warns_once_naming_nproc(devices, nproc, warned):
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "XLA_FLAGS")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               **({"NPROC": nproc} if nproc else {}))
    done = subprocess.run([sys.executable, "-c", IMPORT_LATE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = f"start Python with NPROC={xla_threads.THREADS_PER_DEVICE * devices}."
    short = max(os.cpu_count(), devices) < xla_threads.THREADS_PER_DEVICE * devices
    assert done.stderr.count(expected) == (1 if warned and short else 0), done.stderr
