"""docs/MULTI_NODE.md's commands, as written, over two emulated hosts with their own hostnames
(scripts/bench/cluster/cluster.py): its hostfile, the host check and a training run, with only the page's
placeholders replaced (the host names, the checkout path, the subnet); and the training command under
a killed host and a cut link. mpirun runs on the first host
and reaches the second through the cluster's ssh agent, given in the environment, as ssh would."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from tests.docs.markdown import ROOT, blocks
from jaxring.engine.checkpoint import Checkpoints
from tests.faults import network_probes

sys.path.insert(0, str(ROOT / "scripts" / "bench" / "cluster"))
import cluster  # noqa: E402

DOC = "docs/MULTI_NODE.md"
CHECKOUT, SUBNET, HOSTS = "/opt/jaxring", "10.0.0.0/24", ("node1", "node2")  # the page's placeholders
REASON = network_probes.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster: {REASON}")


def page_command(contains: str, without: str = "\0") -> str:
    """The one command line of the page's sh blocks that contains `contains` and not `without`, continuation
    lines joined."""
    lines = [line.strip() for block in blocks(DOC, "sh") for line in block.replace("\\\n", " ").splitlines()]
    found = [line for line in lines if contains in line and without not in line]
    assert len(found) == 1, f"{DOC}: expected one command with {contains!r}, found {found}"
    return found[0]


def hostfile() -> str:
    (text,) = [block for block in blocks(DOC, "text") if re.match(r"node1 slots=\d", block)]
    return text


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two emulated hosts, and the checkout as the page's /opt/jaxring: a directory whose .venv, scripts
    and examples are this checkout's, holding the page's hosts.txt; torn down whatever happens."""
    with network_probes.one_cluster_at_a_time():
        yield from _two_hosts(tmp_path_factory)


def _two_hosts(tmp_path_factory):
    checkout = tmp_path_factory.mktemp("multi_node")
    for name in (".venv", "scripts", "examples", "configs"):
        (checkout / name).symlink_to(ROOT / name)
    with cluster.Cluster(2, "1gbit", tag="doc") as c:
        names = dict(zip(HOSTS, c.nodes))
        (checkout / "hosts.txt").write_text(re.sub(r"node\d", lambda m: names[m.group(0)], hostfile()))
        yield c, checkout, names
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert c.prefix not in left, left


def start_as_written(hosts, command: str, log: str, timeout_s: int | None = None) -> network_probes.Job:
    """The page's `command` started on the first host, placeholders replaced, output to `log` in the checkout;
    timeout_s: JAXRING_TIMEOUT_S of its processes (None: jaxring's default)."""
    c, checkout, names = hosts
    for placeholder, value in [(CHECKOUT, str(checkout)), (SUBNET, cluster.SUBNET), *names.items()]:
        command = command.replace(placeholder, value)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "XLA_FLAGS"))}
    env.update(JAX_PLATFORMS="cpu",
               PRTE_MCA_plm_ssh_agent=str(cluster.AGENT),  # the emulation's ssh (rsh_agent.sh)
               PRTE_MCA_plm_ssh_no_tree_spawn="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",  # the test runs as root
               OMPI_MCA_mpi_yield_when_idle="1")  # two hosts' processes share this machine's cores
    return network_probes.Job.of_command_line(c.in_namespace(c.nodes[0], shlex.split(command)), env, timeout_s,
                                              checkout / log, cwd=checkout)


def run_as_written(hosts, command: str, timeout_s: float = 150):
    job = start_as_written(hosts, command, "as_written.log")
    code, _ = job.finish(timeout_s)
    if code is None:
        os.killpg(job.process.pid, signal.SIGKILL)
        job.process.wait()
    return code, job.output()


def test_the_host_check_names_both_hosts_and_sums_right(hosts):
    _, _, names = hosts
    code, output = run_as_written(hosts, page_command("scripts/check_hosts.py"))
    assert code == 0, output
    for rank, host in enumerate(names.values()):
        assert re.search(rf"^rank {rank} on {host}: 1 cpu device, python ", output, re.M), output
    first, second = names.values()
    assert f"all-reduce over 2 processes on 2 hosts ({first}, {second}), 2 devices: right" in output, output
    assert "differs between hosts" not in output


def test_a_training_run_across_the_two_hosts_finishes(hosts):
    _, checkout, _ = hosts
    code, output = run_as_written(hosts, page_command("--workdir runs/two_hosts", without="--resume"))
    assert code == 0, output[-4000:]
    assert "1 local cpu device x 2 processes, global batch 64 (32 per device)" in output
    summary = json.loads((checkout / "runs" / "two_hosts" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["local_devices"] == 1 and summary["epochs"] == 2
    assert summary["test_error_rate"] < 0.1, summary  # it learnt: 4 classes, chance is 0.75


def first_host_setting() -> str:
    """The one machine setting the page's 'When it fails' asks of the first host."""
    page = " ".join((ROOT / DOC).read_text().split())
    (sysctl,) = re.findall(r"`(sysctl -w [^`]+)` on the first host", page)
    return sysctl


FAULT_TIMEOUT_S = 10  # JAXRING_TIMEOUT_S of the fault tests: rank 0 gives up on a cut-off rank after it
LONGER = " --set train.epochs=40 --set checkpoint.every_steps=1 --set eval.every_steps=0"  # a fault meets it training


@pytest.mark.parametrize("fault", ["host killed", "link cut"])
def test_a_fault_ends_the_job_naming_the_host_and_the_checkpoint_resumes(hosts, fault):
    """The page's training command as written (without its keepalive options a cut link left mpirun
    running over 100 s here) and its first-host setting; once a checkpoint is written, the second host's processes killed (its daemon
    and rank) or its link cut: the job ends non-zero within the timeout and tests/faults' margin, naming
    the host; every checkpoint on disk reads back and the page's --resume command goes on from the newest."""
    c, checkout, names = hosts
    workdir = f"runs/{fault.replace(' ', '_')}"
    train = page_command("--workdir runs/two_hosts", without="--resume").replace("runs/two_hosts", workdir)
    c.run_in(c.nodes[0], first_host_setting())
    checkpoints = Checkpoints(checkout / workdir / "checkpoints")
    job = start_as_written(hosts, train + LONGER, f"{workdir[5:]}.log", FAULT_TIMEOUT_S)
    try:
        assert job.wait_for(lambda: bool(checkpoints.steps())), job.output()[-2000:]
        network_probes.kill_node(c, 1) if fault == "host killed" else c.cut(1)
        outcome, detail = network_probes.end_after_fault(c, job, FAULT_TIMEOUT_S)
    finally:
        c.restore(1)
        if job.process.poll() is None:
            os.killpg(job.process.pid, signal.SIGKILL)
    assert outcome == "ended", detail
    # Open MPI's lost-daemon report, in either of its two wordings
    assert re.search(rf"(on node|Remote host:) +{names['node2']}\n", job.output()), job.output()[-3000:]
    written = checkpoints.steps()
    for step in written:
        checkpoints.read(step)  # a torn or corrupt file raises CheckpointError
    resume = page_command("--resume").replace("runs/two_hosts", workdir)
    code, output = run_as_written(hosts, f"{resume}{LONGER} --set train.max_steps={max(written) + 2}")
    assert code == 0 and max(checkpoints.steps()) == max(written) + 2, output[-3000:]
