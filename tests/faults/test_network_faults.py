"""Network faults on an emulated 2-node cluster: two representative probes of tests/faults/network_probes.py.

A link cut in the middle of the all-reduces must end every process within
the timeout plus a bounded margin, naming the unreachable rank; a node that
starts late (within the timeout) must not break the job; a training launch
whose node died must not end with status 0. The other probes
and the 10-trial campaigns: `python tests/faults/network_probes.py --trials 10`.
"""

import random
import subprocess

import pytest

from tests.faults import network_probes
from tests.faults.network_probes import cluster_lock  # noqa: F401 (a fixture)
from tests.tiny_runs import ULFM

REASON = network_probes.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster: {REASON}")


@pytest.fixture(autouse=True)
def leaves_no_namespace_or_link(cluster_lock):
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout, _links()
    yield
    assert (subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout, _links()) == before


def _links():
    return sorted(line.split(":")[1].strip() for line in subprocess.run(["ip", "-o", "link"], capture_output=True,
                                                                         text=True).stdout.splitlines())


def test_a_cut_link_ends_every_process_naming_the_unreachable_rank(tmp_path):
    outcome, detail = network_probes.worker_fault(tmp_path, 3, "cut", random.Random(1))
    assert outcome == "ended" and "Open MPI" not in detail, detail


def test_a_killed_rank_is_named_at_once_under_ulfm(tmp_path):
    """SIGKILLed on a live node, under `mpirun --with-ft ulfm`: the other's leg names rank 1, the job exits non-zero."""
    outcome, detail = network_probes.worker_fault(tmp_path, 60, "rank", random.Random(2), ULFM)
    assert outcome == "ended" and "Open MPI" not in detail, detail
    seconds = float(detail.split(" s after")[0].split()[-1])
    assert seconds < 30, detail  # MPI's report, not the 60 s timeout


def test_a_node_starting_late_within_the_timeout_is_waited_for(tmp_path):
    outcome, detail = network_probes.worker_runs_through(tmp_path, "late", 20, 4099, late_s=3)
    assert outcome == "correct", detail


def test_a_training_launch_whose_node_died_never_reports_success(tmp_path, corpus_cache):
    """Node 1's daemon and rank killed mid-training, the launch through scripts/run_checked.py: it ends
    non-zero within the margin, even where mpirun itself said 0 (PRRTE did in 2 of the first 3 trials)."""
    outcome, detail = network_probes.killed_in_training(tmp_path, corpus_cache, 10, random.Random(3))
    assert outcome == "ended", detail
