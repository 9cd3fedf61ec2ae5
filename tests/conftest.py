"""Every test runs on 8 host devices, so multi-device code is exercised without a GPU.

The session's processes share one JAX compilation cache: the suite starts scripts/train.py,
mpirun ranks and other scripts in hundreds of fresh processes that compile the same tiny
programs, and the cache compiles each once (a tiny training run: about 40 s cold, 12 s warm,
on 2 cores). It lives in a directory of this session only (shared by pytest-xdist's workers),
removed at its end, so no run reads another's. With eviction enabled the cache takes a file
lock (filelock, from the `test` extra) around each read and write: without it a process could
read an entry another is still writing; filelock's lock is the kernel's, so a process a test
kills (tests/faults) leaves none behind.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's programs are tiny and most run a few times: XLA's LLVM optimization costs more CPU than
# it saves (tests/models/deepspeech2/test_model.py: 47 s of CPU instead of 78). JAX's own switch: LLVM
# at -O0 without its expensive passes; XLA's HLO passes stay. Every process a test starts inherits it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()


# Set by the process that made the session's cache (pytest, or pytest-xdist's controller): its
# workers, which inherit the environment, use that cache and leave its removal to the maker.
_CACHE_MAKER = "JAXRING_TESTS_COMPILATION_CACHE"


def _share_a_compilation_cache() -> str | None:
    """The cache directory this process made and must remove, or None: where a parent made it, or
    where filelock is missing (JAX refuses a bounded cache without it, an unbounded one takes no lock)."""
    if os.environ.get(_CACHE_MAKER):
        return None
    try:
        import filelock  # noqa: F401
    except ImportError:
        return None
    directory = tempfile.mkdtemp(prefix="jaxring-tests-compilation-cache-")
    os.environ.update(
        {_CACHE_MAKER: directory},
        JAX_COMPILATION_CACHE_DIR=directory,
        JAX_COMPILATION_CACHE_MAX_SIZE=str(4 << 30),  # enables the lock; the suite writes well under 1 GiB
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.25",
    )
    return directory


_COMPILATION_CACHE = _share_a_compilation_cache()


def pytest_unconfigure(config):
    if _COMPILATION_CACHE:
        shutil.rmtree(_COMPILATION_CACHE, ignore_errors=True)


# The modules of the suite's longest tests (each starts mpirun, training runs or a sanitizer build), longest
# first, from the slowest tests `make test --durations` lists. pytest-xdist hands each worker a share of
# the collection and a worker that runs out steals from the end of the other's: run these first, and the
# run ends on short tests, with no core idle while one worker finishes an mpirun job. A module left out
# only runs in its place.
LONGEST_FIRST = (
    "tests/jaxring/collectives/test_mpi.py",
    "tests/scripts/test_train_scripts.py",
    "tests/jaxring/engine/test_resume_shapes.py",
    "tests/faults/test_train_faults.py",
    "tests/jaxring/collectives/test_queued_steps.py",
    "tests/models/deepspeech2/test_rnn_impl.py",
    "tests/scripts/test_multi_node.py",
    # The other modules that build emulated clusters, next to it: one worker runs them all, in turn,
    # where the other worker's test waited up to 66 s for the cluster lock (tests/faults/network_probes.py).
    "tests/scripts/test_cluster.py",
    "tests/scripts/test_bench_step_hosts.py",
    "tests/faults/test_network_faults.py",
    "tests/jaxring/collectives/test_engines_tsan.py",
    "tests/jaxring/engine/test_trainer.py",
    "tests/jaxring/collectives/test_mpi_communicators.py",
    "tests/faults/test_stuck_rank.py",
    "tests/scripts/test_check_persistent_rnn.py",
    "tests/jaxring/engine/test_sync.py",
)


def pytest_collection_modifyitems(config, items):
    """Whole modules move, so a module's fixtures are still set up once; the same order on every worker."""
    root = config.rootpath
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(LONGEST_FIRST)))
