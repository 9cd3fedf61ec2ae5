"""An emulated cluster on this machine: N nodes as network namespaces on a switch, links of a given rate.

    sudo .venv/bin/python scripts/bench/cluster/cluster.py --nodes 2 --rate 1gbit -- \\
        python -m mpi4py scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/net2

makes the cluster, runs the command under mpirun with one process per node,
and tears everything down (on success, failure, Ctrl-C or SIGTERM alike).

Layout: a namespace "<prefix>-sw" holds a Linux bridge (the switch) and mpirun
itself; each node "<prefix>-n<i>" has one veth to the switch, address
198.18.0.<i+1>/24 (198.18.0.0/15 is reserved for benchmarking, RFC 2544; no
address is ever given to the machine's own namespace, so no packet leaves the
emulation). Each node's link is limited in both directions by a tbf qdisc
(`Cluster.link_rate`). Nodes get their own hostname (a UTS namespace, made by
rsh_agent.sh), so Open MPI sees separate nodes and talks TCP between them.

Needs root (CAP_NET_ADMIN) and `ip`, `tc`, `unshare`. Names carry the creating
process' id (`jrc<pid>`), so parallel clusters never collide, and namespaces of
a creator that has died are removed before a new cluster is made.
"""

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT = HERE / "rsh_agent.sh"
PREFIX = "jrc"
# `ip netns exec NAME` shows /etc/netns/NAME/hosts as /etc/hosts: each node
# resolves every node's hostname (gloo and other tools look their own up).
NETNS_ETC = Path("/etc/netns")
SUBNET = "198.18.0.0/24"
SWITCH_ADDRESS = "198.18.0.254"

# Open MPI/PRRTE settings for a job across the namespaces (each also as a PRRTE
# setting, since the daemons read those): TCP only on the cluster's subnet, and
# how fast a daemon that stops answering is declared lost. Without the keepalive
# settings a cut link leaves mpirun waiting for the lost node's daemon for
# 300 + 9 x 20 s (PRRTE's defaults, `prte_info --all`); see docs/TRAINING.md.
KEEPALIVE = {"oob_tcp_keepalive_time": "10", "oob_tcp_keepalive_intvl": "5", "oob_tcp_keepalive_probes": "3"}
# Keepalives only probe an idle connection. After an MPI_Abort, mpirun's kill
# order to the cut-off node's daemon stays unacknowledged, and Linux retransmits
# it for tcp_retries2=15 (about 15 minutes) before giving the connection up;
# mpirun waits that long. 5 retransmissions give up after about 13 s. Set on the
# launch node only (here the switch's namespace; a sysctl on a real cluster): on
# the nodes it would also cut the processes' own MPI connections after 13 s,
# ending the job with Open MPI's "Connection timed out" naming a host before
# jaxring's timeout names the missing rank.
LAUNCH_NODE_TCP_RETRIES2 = 5


def parse_rate(text: str) -> float:
    """Bits per second of a tc-style rate: '10mbit', '1gbit', '2.5gbit', '800kbit'."""
    match = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", text.strip().lower())
    if not match:
        raise ValueError(f"link rate {text!r}: expected a number with kbit, mbit or gbit, e.g. 1gbit")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def tbf_arguments(rate_bps: float) -> list[str]:
    """tc tbf parameters for a link of `rate_bps`.

    The bucket holds 2 ms at the rate (at least 64 KiB, a whole GSO packet:
    veth hands tbf packets of up to 64 KiB), and the queue 20 ms: smaller
    buckets or queues drop packets of a single TCP stream and keep it well below
    the rate (docs/TRAINING.md, "Multi-node, emulated here", the measured stream).
    """
    burst = max(int(rate_bps / 8 * 0.002), 64 << 10)
    return ["rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "20ms"]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _owner_alive(name: str) -> bool:
    """Whether the process whose id follows PREFIX in `name` (then its tag, if any) is alive."""
    match = re.match(rf"{PREFIX}(\d+)", name)
    return bool(match) and Path(f"/proc/{match.group(1)}").exists()


def remove_namespaces(names) -> None:
    """Ends the processes inside each namespace (they keep it and its links alive), then deletes it."""
    names = [n for n in names if n in _namespaces()]
    for name in names:
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for name in names:
        for _ in range(50):  # killed processes leave the namespace a moment later
            if not _ip("netns", "pids", name, check=False).stdout.split():
                break
            time.sleep(0.1)
        _ip("netns", "del", name, check=False)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def remove_stale() -> list[str]:
    """Removes the namespaces of emulated clusters whose creating process has died; returns their names."""
    stale = [n for n in _namespaces() if n.startswith(PREFIX) and not _owner_alive(n)]
    remove_namespaces(stale)
    return stale


def interrupt_on_termination() -> None:
    """SIGTERM, SIGHUP and SIGINT (even where a background shell ignored it) raise KeyboardInterrupt: teardown runs."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)


class Cluster:
    """N namespaces on a bridge; `with Cluster(2, "1gbit") as c:` makes it and always tears it down."""

    def __init__(self, nodes: int, rate: str = "1gbit", tag: str = ""):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes={nodes}: expected 1..200")
        if tag[:1].isdigit():  # the owner's id would read on into the tag (_owner_alive)
            raise ValueError(f"tag={tag!r}: must not start with a digit")
        self.n = nodes
        self.rate_bps = parse_rate(rate)
        self.prefix = f"{PREFIX}{os.getpid()}{tag}"
        self.switch = f"{self.prefix}-sw"
        self.nodes = [f"{self.prefix}-n{i}" for i in range(nodes)]
        self.addresses = [f"198.18.0.{i + 1}" for i in range(nodes)]

    # --- making and removing ---------------------------------------------------

    def names(self) -> list[str]:
        return [self.switch, *self.nodes]

    def create(self) -> "Cluster":
        missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(f"the emulated cluster needs {', '.join(missing)} on PATH")
        remove_stale()
        self.teardown()  # leftovers of an earlier cluster of this process
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self

    def _create(self):
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.nodes))
        for name in self.names():
            _ip("netns", "add", name)
            (NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / name / "hosts").write_text(hosts)
        self.run_in(self.switch, f"sysctl -qw net.ipv4.tcp_retries2={LAUNCH_NODE_TCP_RETRIES2}")
        self.run_in(self.switch, "ip link set lo up && ip link add br0 type bridge && ip link set br0 up"
                    f" && ip addr add {SWITCH_ADDRESS}/24 dev br0")
        for i, (node, address) in enumerate(zip(self.nodes, self.addresses)):
            port = self.port(i)
            # Made inside the node's namespace, so no link ever appears in the machine's own.
            self.run_in(node, f"ip link set lo up && ip link add eth0 type veth peer name {port}"
                              f" && ip link set {port} netns {self.switch}")
            self.run_in(node, f"ip addr add {address}/24 dev eth0 && ip link set eth0 up")
            self.run_in(self.switch, f"ip link set {port} master br0 && ip link set {port} up")
        self.set_rate(self.rate_bps)

    def teardown(self) -> None:
        remove_namespaces(self.names())
        left = [n for n in self.names() if n in _namespaces()]
        if left:
            raise RuntimeError(f"could not remove namespaces {left}: see `ip netns pids NAME`")

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.teardown()

    # --- links -----------------------------------------------------------------

    def port(self, node: int) -> str:
        """The switch's end of node `node`'s link."""
        return f"{self.prefix}p{node}"

    def set_rate(self, rate_bps: float, nodes=None) -> None:
        """Limits both directions of each node's link (all by default) to `rate_bps`."""
        shape = " ".join(tbf_arguments(rate_bps))
        for i in range(self.n) if nodes is None else nodes:
            self.run_in(self.nodes[i], f"tc qdisc replace dev eth0 root tbf {shape}")
            self.run_in(self.switch, f"tc qdisc replace dev {self.port(i)} root tbf {shape}")

    def cut(self, node: int) -> None:
        """Pulls node `node`'s cable: its switch port goes down, packets stop both ways, no reset is sent."""
        self.run_in(self.switch, f"ip link set {self.port(node)} down")

    def restore(self, node: int) -> None:
        self.run_in(self.switch, f"ip link set {self.port(node)} up")

    # --- running -----------------------------------------------------------------

    def processes(self, node: int) -> list[tuple[int, str]]:
        """(pid, program name) of each process inside node `node`'s namespace; any that ends meanwhile left out."""
        found = []
        for pid in _ip("netns", "pids", self.nodes[node], check=False).stdout.split():
            try:
                found.append((int(pid), Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name))
            except OSError:
                continue
        return found

    def run_in(self, namespace: str, shell: str, **kwargs):
        return subprocess.run(["ip", "netns", "exec", namespace, "sh", "-c", shell], check=kwargs.pop("check", True),
                              capture_output=kwargs.pop("capture_output", True), text=True, **kwargs)

    def in_namespace(self, namespace: str, command: list[str]) -> list[str]:
        """`command` run inside `namespace`, with the namespace's name as its hostname."""
        return ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                namespace, *command]

    def mpirun(self, command: list[str], nodes=None, env_names=(), mpirun=None, extra=(), env=None) -> list[str]:
        """mpirun (run in the switch's namespace) starting `command` once on each of `nodes` (all by default).

        `env`: the environment mpirun will run in (default this process's), whose variables it passes on."""
        nodes = list(range(self.n)) if nodes is None else nodes
        mpirun = mpirun or str(Path(sys.executable).parent / "mpirun")
        settings = {"plm_ssh_agent": str(AGENT), "plm_ssh_no_tree_spawn": "1", "oob_tcp_if_include": SUBNET,
                    **KEEPALIVE}
        launch = [mpirun, "--allow-run-as-root", "--host", ",".join(f"{self.nodes[i]}:1" for i in nodes),
                  "-np", str(len(nodes))]
        for name, value in settings.items():
            launch += ["--prtemca", name, value]
        launch += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET,
                   "--mca", "mpi_yield_when_idle", "1", *extra]
        for name in ["PATH", "JAX_PLATFORMS", "XLA_FLAGS", *env_names]:
            if name in (os.environ if env is None else env):
                launch += ["-x", name]
        return self.in_namespace(self.switch, launch + list(command))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="%(prog)s [--nodes N] [--rate R] [--devices-per-node D] -- COMMAND ...")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="each link's rate, both directions (tc syntax: 10mbit, 1gbit)")
    parser.add_argument("--devices-per-node", type=int, default=1, help="host devices of each process (XLA_FLAGS)")
    parser.add_argument("-x", dest="env_names", action="append", default=[], metavar="NAME",
                        help="also pass this environment variable to every process")
    parser.add_argument("--cleanup", action="store_true", help="only remove clusters whose creator has died, and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cleanup:
        print(f"removed {remove_stale() or 'nothing'}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_node}"
    interrupt_on_termination()
    with Cluster(args.nodes, args.rate) as cluster:
        job = subprocess.Popen(cluster.mpirun(command, env_names=args.env_names), start_new_session=True)
        try:
            return job.wait()
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


if __name__ == "__main__":
    sys.exit(main())
