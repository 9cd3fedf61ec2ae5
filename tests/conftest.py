"""Every test runs on 8 host devices, so multi-device code is exercised without a GPU."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()


# Modules whose tests make network namespaces and check that none are left: they never run at once.
EMULATED_NETWORK_MODULES = {"tests/faults/test_network_faults.py", "tests/scripts/test_cluster.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n`, `--dist loadgroup`) a module's tests stay on one worker, so its module-scoped
    runs are made once; the emulated-network modules share one group, so they never run at once."""
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("network" if module in EMULATED_NETWORK_MODULES else module))
