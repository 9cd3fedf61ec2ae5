"""scripts/bench/cluster/cluster.py: an emulated cluster is made, works, and leaves nothing behind, even when interrupted."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench" / "cluster"))

import cluster  # noqa: E402
from tests.faults.network_probes import cluster_lock, one_cluster_at_a_time, skip_reason  # noqa: E402,F401

REASON = skip_reason()


def needs_namespaces(test):
    """Skipped without namespaces; else run holding the lock every test that builds clusters takes."""
    skip = pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster: {REASON}")
    return skip(pytest.mark.usefixtures("cluster_lock")(test))


def state():
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    etc = sorted(p.name for p in cluster.NETNS_ETC.glob("*")) if cluster.NETNS_ETC.exists() else []
    return sorted(netns.splitlines()), sorted(line.split(":")[1].strip() for line in links.splitlines()), etc


def test_rates_parse_like_tc_and_bad_ones_are_refused():
    assert cluster.parse_rate("10mbit") == 10e6 and cluster.parse_rate("2.5Gbit") == 2.5e9
    assert cluster.parse_rate("800kbit") == 800e3
    for bad in ("1gb", "fast", "", "-1gbit"):
        with pytest.raises(ValueError, match="expected a number with kbit"):
            cluster.parse_rate(bad)


def test_the_token_bucket_holds_two_milliseconds_and_at_least_a_gso_packet():
    for rate in (10e6, 1e9, 10e9):
        args = cluster.tbf_arguments(rate)
        burst = int(args[args.index("burst") + 1])
        assert burst == max(int(rate / 8 * 0.002), 65536)
        assert args[args.index("rate") + 1] == f"{int(rate)}bit"


@needs_namespaces
def test_nodes_reach_each_other_by_their_own_hostnames_and_teardown_leaves_nothing():
    before = state()
    with cluster.Cluster(3, "100mbit", tag="t") as c:
        assert set(c.names()) <= set(state()[0][i].split()[0] for i in range(len(state()[0])))
        # Each node has its hostname and reaches the others over TCP (a tiny python echo, no ping needed).
        command = [sys.executable, "-c", "import socket; print(socket.gethostname())"]
        names = [subprocess.run(c.in_namespace(n, command), capture_output=True, text=True, check=True).stdout.strip()
                 for n in c.nodes]
        assert names == c.nodes
        # and resolves every node's hostname to its address (gloo looks its own up)
        lookup = [sys.executable, "-c", f"import socket; print(*map(socket.gethostbyname, {c.nodes!r}))"]
        assert subprocess.run(c.in_namespace(c.nodes[1], lookup), capture_output=True, text=True,
                              check=True).stdout.split() == c.addresses
        probe = (f"{sys.executable} -c \"import socket; s = socket.create_connection(('{c.addresses[2]}', 9), 2)\"")
        refused = c.run_in(c.nodes[0], probe, check=False)
        assert "ConnectionRefusedError" in refused.stderr  # reached node 2, nothing listens: refused, not timed out
        c.cut(2)
        cut = c.run_in(c.nodes[0], probe, check=False)
        assert "ConnectionRefusedError" not in cut.stderr and cut.returncode != 0
        qdiscs = c.run_in(c.nodes[1], "tc qdisc show dev eth0").stdout
        assert "tbf" in qdiscs and "rate 100Mbit" in qdiscs
    assert state() == before


@needs_namespaces
def test_a_second_cluster_right_after_the_first_and_over_leftovers_is_made(tmp_path):
    before = state()
    first = cluster.Cluster(2, tag="t")
    first.create()
    again = cluster.Cluster(2, tag="t").create()  # same names: the leftovers are removed first
    again.teardown()
    assert state() == before


@needs_namespaces
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_tears_everything_down(tmp_path, sig):
    before = state()
    marker = tmp_path / "started"
    command = [sys.executable, str(ROOT / "scripts" / "bench" / "cluster" / "cluster.py"), "--nodes", "2", "--",
               "sh", "-c", f"touch {marker}; sleep 600"]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), job.communicate()[0]
    os.kill(job.pid, sig)
    job.wait(timeout=60)
    assert state() == before


@needs_namespaces
def test_stale_clusters_of_dead_creators_are_removed():
    before = state()
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    name = f"{cluster.PREFIX}{dead}-n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert name in cluster.remove_stale()
    assert state() == before


@needs_namespaces
def test_a_live_creators_tagged_cluster_is_not_stale():
    # Another process's remove_stale (a second pytest-xdist worker) deleted the network probe's
    # tagged namespace while the probe used it: tagged names read as a dead owner's.
    live = f"{cluster.PREFIX}{os.getpid()}probe-n0"
    subprocess.run(["ip", "netns", "add", live], check=True)
    try:
        assert live not in cluster.remove_stale()
        assert live in cluster._namespaces()
    finally:
        cluster.remove_namespaces([live])
    with pytest.raises(ValueError, match="must not start with a digit"):
        cluster.Cluster(1, tag="2nd")


def test_a_cluster_lock_held_elsewhere_times_out_naming_the_lock(tmp_path):
    lock = tmp_path / "clusters.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="clusters.lock: another process has held it for over 0.5 s"):
            with one_cluster_at_a_time(lock, wait_s=0.5):
                pass
        assert time.monotonic() - start < 5
    finally:
        holder.kill()
        holder.wait()
    with one_cluster_at_a_time(lock, wait_s=5):  # free again: taken at once
        pass
