"""Mutation testing: do the tests notice when one line of the code is wrong?

Applies single-line mutations to the Python modules of jaxring/engine/ and
jaxring/collectives/ (a comparison flipped, a constant changed, `and` for
`or`, an operator swapped, a statement removed), runs the tests that cover
the module (TESTS below) against each mutant, and reports the share killed:
a mutant is killed when those tests fail (or exceed --timeout). A surviving
mutant is either a test that asserts too little or an equivalent change;
each survivor is printed with its line to judge which.

One mutant at a time, in a copy of the checkout (the files git lists,
committed or not, plus the compiled extensions), so the checkout itself is
never touched and can be worked on meanwhile. A sitecustomize.py in the copy
takes the editable install's import hook out of every Python process the
tests start, so that they import the copy's (mutated) modules.

    python scripts/dev/mutation_test.py jaxring/engine/rundir.py --sample 40
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import random
import shutil
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[2]

# module -> the pytest arguments that test it (keep in step with tests/).
ENGINE_TESTS = "tests/jaxring/engine"
# The toy-task runs that reach every part of the loop, each seconds long (-x stops at the first failure);
# the rest of test_trainer.py (the mpirun and SIGKILL runs) would make a mutant cost minutes.
TOY_RUNS = [f"{ENGINE_TESTS}/test_trainer.py::{name}" for name in (
    "test_batch_not_divisible_by_replicas_is_a_clear_error",
    "test_a_best_metric_the_task_does_not_report_is_refused_before_step_1",
    "test_every_replica_of_every_process_draws_its_own_rng",
    "test_run_directory",
    "test_test_is_scored_on_the_best_checkpoint_not_the_final_state",
    "test_a_damaged_best_checkpoint_is_not_reported_as_the_step_test_was_scored_on",
    "test_logs_off_a_terminal_are_timestamped_lines_with_status_lines",
    "test_summary_throughput_is_the_whole_training_loop_and_since_the_resume",
    "test_replicas_match_one_device_with_the_whole_batch[2-ring]",
)]
# The three ops and the rules they share: their results against lax's, in one process and across two.
OPS_TESTS = ["tests/jaxring/collectives/test_ring.py", "tests/jaxring/collectives/test_lax_parity.py",
             "tests/jaxring/collectives/test_mpi.py::test_collectives_across_processes[2-1]"]
TESTS: dict[str, list[str]] = {
    "jaxring/engine/checkpoint.py": [f"{ENGINE_TESTS}/test_checkpoint.py"],
    "jaxring/engine/config.py": [f"{ENGINE_TESTS}/test_config.py"],
    "jaxring/engine/rundir.py": [f"{ENGINE_TESTS}/test_rundir.py"],
    "jaxring/engine/metrics.py": [f"{ENGINE_TESTS}/test_metrics.py"],
    "jaxring/engine/progress.py": [f"{ENGINE_TESTS}/test_progress.py"],
    "jaxring/engine/optim.py": [f"{ENGINE_TESTS}/test_optim.py"],
    "jaxring/engine/trainer.py": TOY_RUNS,
    "jaxring/engine/step.py": [f"{ENGINE_TESTS}/test_step.py", *TOY_RUNS],
    "jaxring/engine/batch_check.py": [f"{ENGINE_TESTS}/test_trainer.py::test_a_batch_that_does_not_split_names_the_step_and_the_loader_not_the_config",
                                      f"{ENGINE_TESTS}/test_trainer.py::test_a_batch_of_another_size_is_warned_about_once_or_refused"],
    "jaxring/engine/host_exchange.py": [f"{ENGINE_TESTS}/test_data_check.py", *TOY_RUNS],
    "jaxring/engine/run_shape.py": [f"{ENGINE_TESTS}/test_resume_shapes.py"],
    "jaxring/engine/devices.py": TOY_RUNS,
    "jaxring/engine/evaluation.py": TOY_RUNS,
    "jaxring/engine/sync.py": [f"{ENGINE_TESTS}/test_sync.py", f"{ENGINE_TESTS}/test_trainer.py::test_run_directory"],
    "jaxring/engine/report.py": [f"{ENGINE_TESTS}/test_report.py"],
    "jaxring/engine/timing.py": [f"{ENGINE_TESTS}/test_timing.py"],
    "jaxring/collectives/fusion.py": ["tests/jaxring/collectives/test_fusion.py"],
    **{f"jaxring/collectives/{name}.py": OPS_TESTS
       for name in ("allreduce", "reduce_scatter", "all_gather", "arguments")},
    "jaxring/collectives/ring_primitive.py": [*OPS_TESTS, "tests/jaxring/collectives/test_vmap_axes.py"],
    "jaxring/collectives/index_groups.py": ["tests/jaxring/collectives/test_axis_index_groups.py"],
    "jaxring/collectives/across_processes.py": ["tests/jaxring/collectives/test_mpi.py",
                                                f"{ENGINE_TESTS}/test_sync.py::test_mean_over_two_processes_matches_numpy"],
    "jaxring/collectives/accumulation.py": ["tests/jaxring/collectives/test_accumulation.py",
                                            "tests/jaxring/collectives/test_ring.py",
                                            "tests/jaxring/collectives/test_lax_parity.py"],
    "jaxring/collectives/timeout.py": ["tests/jaxring/collectives/test_timeout.py"],
    "jaxring/collectives/mpi.py": ["tests/jaxring/collectives/test_mpi.py",
                                   f"{ENGINE_TESTS}/test_sync.py::test_mean_over_two_processes_matches_numpy"],
    "jaxring/collectives/agreement.py": ["tests/jaxring/collectives/test_agreement.py",
                                         "tests/jaxring/collectives/test_mpi.py", "tests/jaxring/collectives/test_timeout.py"],
    "jaxring/collectives/replicas.py": ["tests/jaxring/collectives/test_mpi_replicas.py",  # one process; then across 2:
                                        "tests/jaxring/collectives/test_mpi.py::test_collectives_across_processes[2-1]"],
    "jaxring/collectives/topology.py": ["tests/jaxring/collectives/test_mpi_topology.py"],
}

_COMPARE_FLIPS = {
    ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<", ast.Eq: "!=", ast.NotEq: "==",
    ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is",
}
_COMPARE_TEXT = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_BINARY_SWAPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
                 ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "//")}
_BOOL_SWAPS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


class Mutant(NamedTuple):
    line: int  # 1-based
    what: str  # a short description, e.g. "< -> >="
    source: str  # the whole mutated module


def _replace_on_line(lines: list[str], line: int, start: int, stop: int, old: str, new: str) -> str | None:
    """The module with operator `old`, alone between columns start and stop of `line`, replaced by `new`.

    None when that span holds anything but the operator, whitespace and parentheses (a comment, a line break).
    """
    text = lines[line - 1]
    segment = text[start:stop]
    if " ".join(segment.replace("(", " ").replace(")", " ").split()) != old:
        return None
    offset = start + segment.index(old)
    return "".join(lines[: line - 1] + [text[:offset] + new + text[offset + len(old) :]] + lines[line:])


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def _constant_mutation(value) -> str | None:
    if isinstance(value, bool):
        return repr(not value)
    if isinstance(value, int):
        return repr(value + 1)
    if isinstance(value, float):
        return repr(value * 2 if value else 1.0)
    return None  # strings (messages, names) and None are left alone


def mutants(source: str) -> Iterator[Mutant]:
    """Every single-line mutant of `source` that still compiles, in line order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    skip = _docstring_lines(tree)
    found: list[Mutant] = []

    def add(line: int, what: str, mutated: str | None) -> None:
        if mutated is None or line in skip or mutated == source:
            return
        try:
            compile(mutated, "<mutant>", "exec")
        except SyntaxError:
            return
        found.append(Mutant(line, what, mutated))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                if left.end_lineno == right.lineno == node.lineno:
                    old, new = _COMPARE_TEXT[type(op)], _COMPARE_FLIPS[type(op)]
                    add(node.lineno, f"{old} -> {new}",
                        _replace_on_line(lines, node.lineno, left.end_col_offset, right.col_offset, old, new))
                left = right
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_SWAPS:
            if node.left.end_lineno == node.right.lineno:
                old, new = _BINARY_SWAPS[type(node.op)]
                add(node.right.lineno, f"{old} -> {new}", _replace_on_line(
                    lines, node.right.lineno, node.left.end_col_offset, node.right.col_offset, old, new))
        elif isinstance(node, ast.BoolOp):
            old, new = _BOOL_SWAPS[type(node.op)]
            for a, b in zip(node.values, node.values[1:]):
                if a.end_lineno == b.lineno:
                    add(b.lineno, f"{old} -> {new}",
                        _replace_on_line(lines, b.lineno, a.end_col_offset, b.col_offset, old, new))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and node.lineno == node.end_lineno:
            text = lines[node.lineno - 1]
            operand = text[node.operand.col_offset : node.operand.end_col_offset]
            add(node.lineno, "not x -> x", "".join(
                lines[: node.lineno - 1]
                + [text[: node.col_offset] + f"({operand})" + text[node.end_col_offset :]]
                + lines[node.lineno :]))
        elif isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
            new = _constant_mutation(node.value)
            if new is not None:
                text = lines[node.lineno - 1]
                add(node.lineno, f"{text[node.col_offset:node.end_col_offset]} -> {new}", "".join(
                    lines[: node.lineno - 1]
                    + [text[: node.col_offset] + new + text[node.end_col_offset :]]
                    + lines[node.lineno :]))
        if isinstance(node, ast.stmt) and node.lineno == node.end_lineno and not isinstance(
            node, (ast.Pass, ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)
        ) and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            text = lines[node.lineno - 1]
            if text[: node.col_offset].strip():  # not alone on its line (after a colon, a semicolon)
                continue
            # `return x` loses its value; a bare `return` (or any other statement) goes, so the code falls through
            keeps_returning = isinstance(node, ast.Return) and node.value is not None
            what = "return removed" if isinstance(node, ast.Return) else "statement removed"
            replacement = " " * node.col_offset + ("return None" if keeps_returning else "pass") + "\n"
            add(node.lineno, what, "".join(lines[: node.lineno - 1] + [replacement] + lines[node.lineno :]))
    found.sort(key=lambda m: m.line)
    return iter(found)


# Put first on PYTHONPATH in the copy: the editable install (_editable_skbc_jaxring.pth) maps `jaxring`
# to the checkout with an import hook that would win over the copy's files.
_SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]
"""


def make_workspace() -> Path:
    """A copy of the checkout in which `import jaxring` finds the copy (module docstring)."""
    workspace = Path(tempfile.mkdtemp(prefix="jaxring-mutants-"))
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (workspace / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, workspace / name)
    extensions = Path(importlib.util.find_spec("jaxring.collectives._jaxring_cpu").origin).parent
    for library in extensions.glob("*.so"):
        shutil.copy2(library, workspace / "jaxring" / "collectives" / library.name)
    (workspace / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return workspace


def run_tests(workspace: Path, test_args: list[str], timeout_s: float) -> str:
    """'killed', 'survived' or 'timeout' for the tests at `test_args` against the modules of `workspace`."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *test_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(workspace), os.environ.get("PYTHONPATH")]))}
    try:
        result = subprocess.run(command, cwd=workspace, env=env, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if result.returncode == 0 else "killed"


def check_workspace(workspace: Path) -> None:
    """Raises unless Python started as the tests are imports jaxring from `workspace`."""
    env = {**os.environ, "PYTHONPATH": str(workspace)}
    found = subprocess.run([sys.executable, "-c", "import jaxring.engine.config as m; print(m.__file__)"],
                           cwd=workspace, env=env, capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(workspace)):
        raise SystemExit(f"the tests would import jaxring from {found or 'nowhere'}, not from the copy {workspace}")


def mutate_module(workspace: Path, module: str, sample: int | None, seed: int, timeout_s: float):
    """(killed, timed out, total, survivors) of `module`'s mutants (a random `sample` of them if given)."""
    path = workspace / module
    original = path.read_text()
    found = list(mutants(original))
    if sample is not None and sample < len(found):
        found = sorted(random.Random(seed).sample(found, sample), key=lambda m: m.line)
    if run_tests(workspace, TESTS[module], timeout_s) != "survived":  # else every mutant would count as killed
        raise SystemExit(f"the tests of {module} ({' '.join(TESTS[module])}) fail without any mutant: fix them first")
    killed = timed_out = 0
    survivors = []
    try:
        for number, mutant in enumerate(found, 1):
            path.write_text(mutant.source)
            started = time.perf_counter()
            outcome = run_tests(workspace, TESTS[module], timeout_s)
            killed += outcome == "killed"
            timed_out += outcome == "timeout"
            line = original.splitlines()[mutant.line - 1].strip()
            print(f"{module}:{mutant.line} [{number}/{len(found)}] {mutant.what}: {outcome} "
                  f"({time.perf_counter() - started:.0f} s)  | {line}", flush=True)
            if outcome == "survived":
                survivors.append((mutant.line, mutant.what, line))
    finally:
        path.write_text(original)
    return killed, timed_out, len(found), survivors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=sorted(TESTS), help="modules (paths from the repository root)")
    parser.add_argument("--sample", type=int, help="test a random sample of this many mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant; longer counts as killed")
    parser.add_argument("--list", action="store_true", help="only list the mutants, run nothing")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TESTS]
    if unknown:
        raise SystemExit(f"no tests mapped for {', '.join(unknown)}; modules with tests: {', '.join(TESTS)}")
    if args.list:
        for module in args.modules:
            for mutant in mutants((ROOT / module).read_text()):
                print(f"{module}:{mutant.line} {mutant.what}")
        return 0
    total_killed = total = 0
    report = []
    workspace = make_workspace()
    try:
        check_workspace(workspace)
        for module in args.modules:
            killed, timed_out, count, survivors = mutate_module(workspace, module, args.sample, args.seed, args.timeout)
            total_killed += killed + timed_out
            total += count
            report.append(f"{module}: {killed + timed_out}/{count} killed ({timed_out} by the timeout)")
            report += [f"  survived {module}:{line} {what}  | {text}" for line, what, text in survivors]
    finally:
        shutil.rmtree(workspace)
    print("\n".join(report))
    print(f"killed {total_killed}/{total} = {100 * total_killed / max(total, 1):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
