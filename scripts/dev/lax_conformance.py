"""Runs JAX's own tests with jax.lax's collectives rebound to jaxring's, and counts what jaxring takes.

jaxring's ops are meant as a drop-in for jax.lax's (jaxring/collectives/allreduce.py,
reduce_scatter.py, all_gather.py): psum, pmean, pmax and pmin are jaxring.allreduce with
op="sum", "mean", "max", "min"; psum_scatter is jaxring.reduce_scatter; all_gather is
jaxring.all_gather. This script runs a set of JAX's test files
twice under pytest, from a checkout of JAX at the installed jax's tag:

  git clone --depth 1 --branch jax-v$(python -c 'import jax; print(jax.__version__)') \\
      https://github.com/jax-ml/jax /tmp/jax
  .venv/bin/python scripts/dev/lax_conformance.py --jax-tests /tmp/jax --json runs/lax_conformance.json

once as they are (the baseline) and once with this file loaded as a pytest plugin that rebinds
jax.lax's collectives for the whole run. Each rebound call the tests make tries jaxring's op:

- taken: jaxring's op ran (its result is what the test sees);
- refused: jaxring raised one of the errors it raises for what it does not take (REFUSALS: a dtype,
  a kind of reduction, a vmap axis, ...) or the call passes an argument jaxring does not take with a
  value other than lax's default; the call is counted by reason and falls back to lax's op, so the
  test goes on;
- raised: jaxring raised anything else, which propagates (the test sees jaxring's error where lax
  would have answered or refused in its own words).

Calls that jax's own code makes by name (a module of jax calling jax.lax.all_gather) stay lax's,
counted apart; calls made while jaxring's op runs (jaxring falls back to lax itself in places) stay
lax's, uncounted. (jax's own lax.pmean calls psum directly, never through jax.lax.) The table
compares each test's outcome in the two runs: a test failing in both is JAX's or the environment's,
one failing only when rebound is jaxring's to explain.

JAX's tests ask for 8 host CPU devices themselves (jtu.request_cpu_devices(8) at the top of each
module, which sets jax_num_cpu_devices); both runs also get XLA_FLAGS with 8 host devices, so that
jaxring, imported first by the plugin, sizes XLA's client threads for them
(jaxring/collectives/xla_threads.py). pytest runs with JAX's own configuration (its pyproject.toml:
warnings are errors, --import-mode=importlib) from a scratch directory, so that `import jax` is the
installed jax and never the checkout's sources.
"""

from __future__ import annotations

import argparse
import collections
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The test files of JAX's tests/ that call lax's collectives most (grep -c at jax-v0.10.2:
# pmap_test 54 calls by name, shard_map_test 50, batching_test 8 (collectives under vmap),
# async_collectives_test 3 (the collectives on their own)).
DEFAULT_FILES = ("pmap_test.py", "shard_map_test.py", "batching_test.py", "async_collectives_test.py")

# lax's name -> (jaxring's op, the arguments that make it lax's).
REBOUND = {
    "psum": ("allreduce", {"op": "sum"}),
    "pmean": ("allreduce", {"op": "mean"}),
    "pmax": ("allreduce", {"op": "max"}),
    "pmin": ("allreduce", {"op": "min"}),
    "psum_scatter": ("reduce_scatter", {}),
    "all_gather": ("all_gather", {}),
}

# What jaxring raises for what it does not take (jaxring/collectives/arguments.py, kinds.py and the ops' modules), as (exception type,
# message pattern, reason); the reason is a format string over the pattern's groups. Anything else
# jaxring raises propagates: a new refusal shows up as failing tests until it is listed here.
REFUSALS = (
    (TypeError, r"takes arrays of .*, got (\w+)", "dtype {0}"),
    (ValueError, r"op must be one of .*, got '(\w+)'", "reduction {0}"),
    (ValueError, r"jaxring collectives run inside jax\.pmap or jax\.shard_map", "not under pmap or shard_map"),
    (NotImplementedError, r"jaxring\.all_gather\(\.\.\., to='(\w+)'\)", "argument to={0}"),
    # Refused by lax too, each in its own words: jaxring says so in the call, lax's op then raises its own.
    (ValueError, r"reduced or unreduced over some of them", "value reduced, or unreduced over some axes"),
    ((AssertionError, ValueError), r"is a vmap axis, which no value's type varies over", "vmap axis under check_vma"),
    (NotImplementedError, r"of which \[.*\] is a vmap axis", "vmap axis in a tuple of a gather or scatter"),
    (NotImplementedError, r"axis_index_groups (under jax\.shard_map|not supported in vmap)", "axis_index_groups"),
)

ENV_REBIND = "LAX_CONFORMANCE_REBIND"  # "1": the plugin rebinds lax's collectives
ENV_RECORDS = "LAX_CONFORMANCE_RECORDS"  # the directory each pytest process writes its records to
HOST_DEVICES = 8


# --- the plugin: runs inside pytest (and in each pytest-xdist worker) ---------------------------


class CallCounter:
    """The rebound calls of one pytest process, by op, outcome and reason, and per test."""

    def __init__(self):
        self.calls = collections.Counter()  # (lax name, outcome, reason)
        self.per_test = collections.defaultdict(collections.Counter)  # nodeid -> "outcome[: reason]" -> count
        self.current_test = None

    def count(self, name, outcome, reason=""):
        self.calls[(name, outcome, reason)] += 1
        self.per_test[self.current_test or "(outside a test)"][f"{outcome}: {reason}" if reason else outcome] += 1

    def as_json(self):
        return {
            "calls": [{"op": n, "outcome": o, "reason": r, "count": c} for (n, o, r), c in sorted(self.calls.items())],
            "per_test": {test: dict(counts) for test, counts in self.per_test.items()},
        }


def refusal_reason(error: BaseException) -> str | None:
    """The reason jaxring refused a call, when `error` is one of REFUSALS; None otherwise."""
    for error_type, pattern, reason in REFUSALS:
        match = re.search(pattern, str(error)) if isinstance(error, error_type) else None
        if match:
            return reason.format(*match.groups())
    return None


def _is_default(value, parameter: inspect.Parameter) -> bool:
    default = parameter.default
    same_literal = type(value) is type(default) and isinstance(value, (bool, int, str)) and value == default
    return value is default or same_literal


class Rebinder:
    """Rebinds jax.lax's collectives to jaxring's ops for the calls that test code makes."""

    def __init__(self, counter: CallCounter):
        import jax
        import jaxring

        self._lax = jax.lax
        self._jaxring = jaxring
        self._counter = counter
        self._inside_jaxring = threading.local()
        self.originals = {name: getattr(jax.lax, name) for name in REBOUND}

    def install(self):
        for name, original in self.originals.items():
            setattr(self._lax, name, self._rebound(name, original))

    def _rebound(self, name, original):
        jaxring_op_name, fixed = REBOUND[name]
        jaxring_op = getattr(self._jaxring, jaxring_op_name)
        lax_parameters = inspect.signature(original)
        jaxring_parameters = inspect.signature(jaxring_op).parameters

        @functools.wraps(original)
        def rebound(*args, **kwargs):
            if getattr(self._inside_jaxring, "depth", 0):  # jaxring's own fallback to lax
                return original(*args, **kwargs)
            if _named_by_jax(name, sys._getframe(1)):
                self._counter.count(name, "jax's own")
                return original(*args, **kwargs)
            try:
                bound = lax_parameters.bind(*args, **kwargs)
            except TypeError:
                self._counter.count(name, "lax's error", "arguments lax does not take")
                return original(*args, **kwargs)
            x, axis_name, *_ = bound.arguments.values()
            options, unsupported = {}, []
            for argument, value in list(bound.arguments.items())[2:]:
                if argument in jaxring_parameters:
                    options[argument] = value
                elif not _is_default(value, lax_parameters.parameters[argument]):
                    unsupported.append(argument)
            if unsupported:
                self._counter.count(name, "refused", "argument " + ", ".join(unsupported))
                return original(*args, **kwargs)
            self._inside_jaxring.depth = getattr(self._inside_jaxring, "depth", 0) + 1
            try:
                result = jaxring_op(x, axis_name, **fixed, **options)
            except Exception as error:
                reason = refusal_reason(error)
                if reason is None:
                    self._counter.count(name, "raised", f"{type(error).__name__}: {_first_line(error)}")
                    raise
                self._counter.count(name, "refused", reason)
                return original(*args, **kwargs)
            finally:
                self._inside_jaxring.depth -= 1
            self._counter.count(name, "taken")
            return result

        return rebound


def _named_by_jax(name, caller) -> bool:
    """Whether jax's own code calls the op by its name (a call that stays lax's); a function of jax that
    only calls what it was given, as pmap(partial(lax.psum, ...)), makes the test's call."""
    module = caller.f_globals.get("__name__", "")
    return module.split(".")[0] in ("jax", "jaxlib") and name in caller.f_code.co_names


def _first_line(error: BaseException, limit: int = 200) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else "")[:limit]


class Recorder:
    """The pytest plugin: rebinds where asked, and writes this process' records at the session's end."""

    def __init__(self, records: Path, rebind: bool):
        self.records = records
        self.counter = CallCounter()
        self.outcomes = {}  # nodeid -> {"outcome": ..., "message": ...} (the process that reports)
        if rebind:
            Rebinder(self.counter).install()

    def pytest_runtest_setup(self, item):
        self.counter.current_test = item.nodeid

    def pytest_runtest_logreport(self, report):
        record = self.outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
        if report.failed and record["outcome"] != "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            record.update(outcome="failed", message=message.strip().splitlines()[0][:300] if message.strip() else "")
        elif report.skipped and record["outcome"] == "passed":
            record["outcome"] = "skipped"

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (self.records / f"calls-{worker}.json").write_text(json.dumps(self.counter.as_json()))
        if not hasattr(session.config, "workerinput"):  # the controller (or the one process) has every report
            (self.records / "outcomes.json").write_text(json.dumps(self.outcomes))


def pytest_configure(config):
    """Entry point when pytest loads this file with -p lax_conformance."""
    records = os.environ.get(ENV_RECORDS)
    if records:
        recorder = Recorder(Path(records), rebind=os.environ.get(ENV_REBIND) == "1")
        config.pluginmanager.register(recorder, "lax_conformance_recorder")


# --- the script: two pytest runs and their comparison -------------------------------------------


def checkout_version(jax_checkout: Path) -> str:
    version_file = jax_checkout / "jax" / "version.py"
    match = re.search(r'^_version\s*=\s*"([^"]+)"', version_file.read_text(), re.M) if version_file.is_file() else None
    if not match or not (jax_checkout / "tests").is_dir():
        raise SystemExit(
            f"error: {jax_checkout} is not a checkout of JAX (no jax/version.py with _version, or no tests/). "
            f"Get one with: {clone_command()}"
        )
    return match.group(1)


def installed_jax_version() -> str:
    from importlib.metadata import version

    return version("jax")


def clone_command() -> str:
    return f"git clone --depth 1 --branch jax-v{installed_jax_version()} https://github.com/jax-ml/jax DIR"


def jaxring_commit() -> str | None:
    """The commit of the checkout the runs import jaxring from, when it is one (an editable install)."""
    import importlib.util

    spec = importlib.util.find_spec("jaxring")
    if spec is None or spec.origin is None:
        return None
    run = subprocess.run(["git", "-C", str(Path(spec.origin).parent), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else None


def jax_tests_argv(jax_checkout: Path, files, keyword, workers) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "lax_conformance", "-p", "no:cacheprovider",
               "-c", str(jax_checkout / "pyproject.toml"), "--rootdir", str(jax_checkout),
               "-n", str(workers), "-o", "console_output_style=classic"]
    if keyword:
        command += ["-k", keyword]
    return command + [str(jax_checkout / "tests" / f) for f in files]


def run_pytest(command, rebind: bool, log: Path) -> dict:
    """One pytest run in a scratch directory; its records (calls and outcomes) and its wall time."""
    with tempfile.TemporaryDirectory(prefix="lax-conformance-") as scratch:
        records = Path(scratch) / "records"
        records.mkdir()
        xla_flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]),
            XLA_FLAGS=f"{xla_flags} --xla_force_host_platform_device_count={HOST_DEVICES}".strip(),
            JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
            **{ENV_RECORDS: str(records), ENV_REBIND: "1" if rebind else "0"},
        )
        start = time.monotonic()
        with open(log, "w") as out:
            returncode = subprocess.run(command, cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        seconds = time.monotonic() - start
        outcomes_file = records / "outcomes.json"
        if returncode not in (0, 1) or not outcomes_file.is_file():  # 1: some tests failed; else it did not run them
            run = "rebound" if rebind else "baseline"
            raise SystemExit(f"error: pytest ended with exit status {returncode} ({run} run); see {log}")
        calls = collections.Counter()
        per_test = collections.defaultdict(collections.Counter)
        for worker_file in records.glob("calls-*.json"):
            worker = json.loads(worker_file.read_text())
            for row in worker["calls"]:
                calls[(row["op"], row["outcome"], row["reason"])] += row["count"]
            for test, counts in worker["per_test"].items():
                per_test[test].update(counts)
        return {"outcomes": json.loads(outcomes_file.read_text()), "calls": calls, "per_test": per_test,
                "seconds": seconds, "pytest_exit": returncode}


def compare(baseline: dict, rebound: dict) -> dict:
    """The summary: rebound calls by outcome and reason, tests by outcome in each run and by pair."""
    calls = rebound["calls"]
    by_outcome = collections.Counter()
    refused, raised, by_op = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
    for (op, outcome, reason), count in calls.items():
        by_outcome[outcome] += count
        by_op[op][outcome] += count
        if outcome == "refused":
            refused[reason] += count
        elif outcome == "raised":
            raised[reason] += count
    pairs = collections.Counter()
    only_rebound = {}
    for test in sorted(set(baseline["outcomes"]) | set(rebound["outcomes"])):
        before = baseline["outcomes"].get(test, {"outcome": "not run"})
        after = rebound["outcomes"].get(test, {"outcome": "not run"})
        pairs[f"{before['outcome']} -> {after['outcome']}"] += 1
        if after["outcome"] == "failed" and before["outcome"] != "failed":
            only_rebound[test] = after.get("message", "")
    calls_by_test = {test: dict(counts) for test, counts in sorted(rebound["per_test"].items())}
    return {
        "calls": {
            "total": sum(by_outcome[o] for o in ("taken", "refused", "raised")),
            "taken": by_outcome["taken"],
            "refused": by_outcome["refused"],
            "raised": by_outcome["raised"],
            "lax_errors": by_outcome["lax's error"],
            "left_to_lax_as_jax_own": by_outcome["jax's own"],
            "refused_by_reason": dict(refused.most_common()),
            "raised_by_reason": dict(raised.most_common()),
            "by_op": {op: dict(counts) for op, counts in sorted(by_op.items())},
            "tests_with_a_taken_call": sum(1 for counts in calls_by_test.values() if counts.get("taken")),
        },
        "calls_by_test": calls_by_test,
        "tests": {
            "baseline": dict(collections.Counter(r["outcome"] for r in baseline["outcomes"].values())),
            "rebound": dict(collections.Counter(r["outcome"] for r in rebound["outcomes"].values())),
            "baseline_to_rebound": dict(pairs.most_common()),
            "failed_only_rebound": only_rebound,
        },
        "seconds": {"baseline": round(baseline["seconds"], 1), "rebound": round(rebound["seconds"], 1)},
    }


def print_table(summary: dict, out=sys.stdout):
    calls, tests = summary["calls"], summary["tests"]
    print(f"rebound calls: {calls['total']}, taken by jaxring {calls['taken']}, refused {calls['refused']}, "
          f"raised {calls['raised']} (not counted: lax's own errors {calls['lax_errors']}, "
          f"calls by jax's own code {calls['left_to_lax_as_jax_own']})", file=out)
    for op, counts in calls["by_op"].items():
        print(f"  {op:14s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=out)
    for title, reasons in (("refused", calls["refused_by_reason"]), ("raised", calls["raised_by_reason"])):
        if reasons:
            print(f"{title}, by reason:", file=out)
            for reason, count in reasons.items():
                print(f"  {count:6d}  {reason}", file=out)
    print("tests        " + "  ".join(f"{run}: " + ", ".join(f"{k} {v}" for k, v in sorted(tests[run].items()))
                                     for run in ("baseline", "rebound")), file=out)
    print("baseline -> rebound: " + ", ".join(f"{k} {v}" for k, v in tests["baseline_to_rebound"].items()), file=out)
    if tests["failed_only_rebound"]:
        print("failed only when rebound:", file=out)
        for test, message in tests["failed_only_rebound"].items():
            print(f"  {test}\n      {message}", file=out)
    seconds = summary["seconds"]
    print(f"wall time: baseline {seconds['baseline']} s, rebound {seconds['rebound']} s", file=out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"Get JAX's tests at the installed version with: {clone_command()}")
    parser.add_argument("--jax-tests", type=Path, required=True,
                        help="a checkout of JAX at the installed jax's tag (tests/, pyproject.toml, jax/version.py)")
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES),
                        help=f"test files under its tests/ (default: {' '.join(DEFAULT_FILES)})")
    parser.add_argument("-k", dest="keyword", help="pytest's -k expression, to run part of the files")
    parser.add_argument("-n", dest="workers", type=int, default=2, choices=(0, 1, 2),
                        help="pytest-xdist workers per run (default 2; 0: one process)")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--logs", type=Path, help="keep the two pytest logs in this directory (default: a scratch one)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    checkout = args.jax_tests.resolve()
    version, installed = checkout_version(checkout), installed_jax_version()
    if version != installed:
        raise SystemExit(f"error: {checkout} holds JAX {version}'s tests, the installed jax is {installed}; "
                         f"run on a checkout of the installed version's tag: {clone_command()}")
    missing = [f for f in args.files if not (checkout / "tests" / f).is_file()]
    if missing:
        raise SystemExit(f"error: no {', '.join(missing)} under {checkout / 'tests'}")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="lax-conformance-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    command = jax_tests_argv(checkout, args.files, args.keyword, args.workers)
    baseline = run_pytest(command, rebind=False, log=logs / "baseline.log")
    rebound = run_pytest(command, rebind=True, log=logs / "rebound.log")
    summary = {"jax": installed, "jaxring_commit": jaxring_commit(), "jax_tests": str(checkout), "files": args.files,
               "keyword": args.keyword, "pytest": command[1:], "logs": str(logs), **compare(baseline, rebound)}
    print_table(summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
