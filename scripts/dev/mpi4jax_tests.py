"""Runs mpi4jax's own tests of the reductions against jaxring.mpi4jax, with only the import changed.

  .venv/bin/python scripts/dev/mpi4jax_tests.py --baseline --json docs/bench/mpi4jax-tests-2026-12-03.json

takes the tests of allreduce, reduce and allgather (TEST_FILES) from the sdist of the installed
mpi4jax's release (cached under data/cache/mpi4jax/, else fetched from PyPI and checked against
PyPI's sha256), rewrites `from mpi4jax import X` to `from jaxring.mpi4jax import X` and `import
mpi4jax` to `import jaxring.mpi4jax as mpi4jax` (nothing else), and runs them with pytest under
`mpirun -np N` (2 by default), as mpi4jax's CI does. --baseline runs them unchanged first, against
mpi4jax itself. Each test is, over every rank:

- taken: it passed;
- refused: it failed on an error of jaxring.mpi4jax's own refusals (what the ring does not do);
- failed: it failed on anything else: jaxring.mpi4jax differing from mpi4jax, on purpose where
  ON_PURPOSE names the test (docs/USAGE.md, "Coming from mpi4jax"), else to be explained;
- skipped: pytest skipped it.

The table and the JSON name every test that was not taken, with its reason.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from lax_conformance import jaxring_commit

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "data" / "cache" / "mpi4jax"
MPIRUN = Path(sys.executable).parent / "mpirun"
TEST_FILES = ("tests/collective_ops/test_allreduce.py", "tests/collective_ops/test_reduce.py",
              "tests/collective_ops/test_allgather.py")
# jaxring.mpi4jax's refusals all begin so (jaxring/mpi4jax.py).
REFUSAL = "jaxring.mpi4jax."
# The tests that fail on a difference made on purpose (docs/USAGE.md, "Coming from mpi4jax"): still counted failed.
GRADIENT = "the gradient: jaxring's transpose of a sum over processes is that sum, mpi4jax's the identity"
ON_PURPOSE = {f"test_allreduce::{name}": GRADIENT for name in (
    "test_allreduce_transpose", "test_allreduce_transpose_jit", "test_allreduce_grad", "test_allreduce_vjp",
    "test_allreduce_chained", "test_allreduce_chained_jit")}
IMPORTS = ((re.compile(r"^(\s*)from mpi4jax import ", re.M), r"\1from jaxring.mpi4jax import "),
           (re.compile(r"^(\s*)import mpi4jax$", re.M), r"\1import jaxring.mpi4jax as mpi4jax"))


def sdist(version: str, cache: Path = CACHE) -> Path:
    """The sdist of mpi4jax `version`, from the cache or from PyPI (checked against PyPI's sha256)."""
    path = cache / f"mpi4jax-{version}.tar.gz"
    if path.exists():
        return path
    # The project's JSON, not the release's (pypi.org/pypi/mpi4jax/VERSION/json answered 404 here on 2026-12-03,
    # and its mirror gives the files' addresses relative to the JSON's)
    index = "https://pypi.org/pypi/mpi4jax/json"
    with urllib.request.urlopen(index, timeout=60) as answer:
        releases = json.load(answer)["releases"]
    if version not in releases:
        raise RuntimeError(f"PyPI lists no mpi4jax {version} (installed here); its releases: {', '.join(releases)}")
    (source,) = [url for url in releases[version] if url["packagetype"] == "sdist"]
    with urllib.request.urlopen(urllib.parse.urljoin(index, source["url"]), timeout=120) as answer:
        data = answer.read()
    if hashlib.sha256(data).hexdigest() != source["digests"]["sha256"]:
        raise RuntimeError(f"{source['url']}: the download's sha256 is not PyPI's")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def rewritten(text: str) -> tuple[str, int]:
    """`text` with mpi4jax's imports turned into jaxring.mpi4jax's, and how many were."""
    count = 0
    for pattern, replacement in IMPORTS:
        text, n = pattern.subn(replacement, text)
        count += n
    return text, count


def extract(archive: Path, into: Path, drop_in: bool) -> int:
    """TEST_FILES and tests/conftest.py from `archive` into `into`, imports rewritten where
    `drop_in`; the number of imports rewritten."""
    count = 0
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        for name in (*TEST_FILES, "tests/conftest.py"):
            text = tar.extractfile(f"{top}/{name}").read().decode()
            if drop_in:
                text, n = rewritten(text)
                count += n
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return count


def run(tests: Path, n_procs: int, select: str | None, timeout_s: float) -> dict[str, dict]:
    """Each test's outcome over every rank of `mpirun -np n_procs pytest` in `tests`: name -> {outcome, reason}."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    # A test that leaves the ranks out of step ends in jaxring's timeout, not the whole run's.
    environment.update(JAX_PLATFORMS="cpu", JAXRING_TIMEOUT_S="20", PYTHONPATH=str(ROOT))
    start = ("import os, sys, pytest; rank = os.environ['OMPI_COMM_WORLD_RANK']; "
             "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--junitxml', f'rank{rank}.xml', *sys.argv[1:]]))")
    command = [str(MPIRUN), "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
               "-np", str(n_procs), "-x", "JAX_PLATFORMS", "-x", "JAXRING_TIMEOUT_S", "-x", "PYTHONPATH",
               sys.executable, "-c", start, *TEST_FILES, *(["-k", select] if select else [])]
    done = subprocess.run(command, cwd=tests, env=environment, capture_output=True, text=True, timeout=timeout_s)
    reports = [tests / f"rank{rank}.xml" for rank in range(n_procs)]
    if not all(report.exists() for report in reports):
        raise RuntimeError(f"pytest left no report on some rank:\n{done.stdout}\n{done.stderr}")
    outcomes: dict[str, dict] = {}
    for report in reports:
        for case in ElementTree.parse(report).iter("testcase"):
            name = f"{Path(case.get('file') or case.get('classname').replace('.', '/')).stem}::{case.get('name')}"
            outcome = worse(outcomes.get(name), outcome_of(case))
            outcomes[name] = outcome
    return outcomes


def outcome_of(case) -> dict:
    for tag in ("failure", "error"):
        if (element := case.find(tag)) is not None:
            message = (element.get("message") or "").strip().splitlines()[0][:300] if element.get("message") else ""
            return {"outcome": "refused" if REFUSAL in (element.get("message") or "") else "failed",
                    "reason": message}
    if case.find("skipped") is not None:
        return {"outcome": "skipped", "reason": case.find("skipped").get("message", "")}
    return {"outcome": "taken", "reason": ""}


ORDER = ("taken", "skipped", "refused", "failed")


def worse(a: dict | None, b: dict) -> dict:
    """Of two ranks' outcomes of a test, the one further from passing."""
    return b if a is None or ORDER.index(b["outcome"]) > ORDER.index(a["outcome"]) else a


def counts(outcomes: dict[str, dict]) -> dict[str, int]:
    return {kind: sum(o["outcome"] == kind for o in outcomes.values()) for kind in ORDER}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2, help="MPI processes (mpi4jax's CI runs 2)")
    parser.add_argument("-k", dest="select", help="pytest's -k: a selection of the tests")
    parser.add_argument("--baseline", action="store_true", help="first run the tests unchanged, against mpi4jax")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the sdist is kept")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--json", type=Path, help="write the counts and every test's outcome here")
    args = parser.parse_args(argv)

    version = importlib.metadata.version("mpi4jax")
    archive = sdist(version, args.cache)
    result = {"date": datetime.date.today().isoformat(), "jaxring_commit": jaxring_commit(), "mpi4jax": version,
              "jax": importlib.metadata.version("jax"), "processes": args.np, "files": list(TEST_FILES), "select": args.select}
    runs = {"drop_in": True, **({"baseline": False} if args.baseline else {})}
    for label, drop_in in sorted(runs.items(), key=lambda item: item[0] != "baseline"):
        with tempfile.TemporaryDirectory(prefix="mpi4jax-tests-") as scratch:
            rewrites = extract(archive, Path(scratch), drop_in)
            if drop_in and not rewrites:
                raise RuntimeError(f"no mpi4jax import found to change in {TEST_FILES}")
            outcomes = run(Path(scratch), args.np, args.select, args.timeout)
        for name, outcome in outcomes.items():
            if outcome["outcome"] == "failed" and drop_in and name in ON_PURPOSE:
                outcome["on_purpose"] = ON_PURPOSE[name]
        result[label] = {"imports_changed": rewrites, "counts": counts(outcomes),
                         "failed_on_purpose": sum("on_purpose" in o for o in outcomes.values()), "tests": outcomes}
        print(f"{label} ({'jaxring.mpi4jax' if drop_in else 'mpi4jax'}, {rewrites} imports changed): "
              + ", ".join(f"{n} {kind}" for kind, n in counts(outcomes).items())
              + f" ({result[label]['failed_on_purpose']} of the failed on purpose)")
        for name, outcome in outcomes.items():
            if outcome["outcome"] != "taken":
                print(f"  {outcome['outcome']:8} {name}: {outcome.get('on_purpose', outcome['reason'])}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
