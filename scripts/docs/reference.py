"""Writes docs/REFERENCE.md: the public API, the environment variables, the config sections and the scripts.

    python scripts/docs/reference.py            # rewrite docs/REFERENCE.md
    python scripts/docs/reference.py --check    # exit 1, saying so, where docs/REFERENCE.md differs

Each entry comes from the code it describes: a function's signature and its docstring's first
paragraph, a script's module docstring (or a shell script's first comment), the config sections of
scripts/docs/config_reference.py. The environment variables are ENVIRONMENT below: each row names the
file that reads the variable, its default comes from that file's constant where it has one, and
tests/docs/test_reference.py fails when the code reads a variable the table lacks.
"""

import argparse
import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "docs"))

import config_reference  # noqa: E402  (its sys.path set-up makes models/ importable)
import jaxring  # noqa: E402
from jaxring.collectives import fusion, timeout, xla_threads  # noqa: E402
from jaxring.engine import progress  # noqa: E402

OUTPUT = ROOT / "docs" / "REFERENCE.md"
GPU_CHECK = ROOT / "scripts" / "gpu" / "gpu_check.sh"
SCRIPT_SUFFIXES = (".py", ".sh")


def _gpu_check_default(name: str) -> str:
    return re.search(rf'\${{{name}:-([^}}]*)}}', GPU_CHECK.read_text()).group(1)


def _cuda_home_default() -> str:
    return re.search(r'environ\.get\("CUDA_HOME", "([^"]+)"\)', (ROOT / "scripts/dev/sanitize_rnn_kernels.py").read_text()).group(1)


# (name, the file that reads it, values, default, effect). Who reads it sets the scope: the
# library (jaxring/) for every user, scripts/ for that script's runs.
ENVIRONMENT = [
    ("JAXRING_TIMEOUT_S", "jaxring/collectives/timeout.py", "seconds > 0, or `inf`",
     f"{timeout.FALLBACK_S:g}", "how long a collective waits for its peers before it fails naming them; "
     "read once, at the first collective (docs/USAGE.md, 'When a device never arrives')"),
    ("JAXRING_CUDA_ENGINE", "jaxring/collectives/csrc/cuda/engine_choice.cc", "`host`, `device`, `device-any-link`",
     "`host`", "the CUDA engine of the ring; any other value fails the process's first collective "
     "(docs/CUDA_RING.md)"),
    ("JAXRING_LOG", "jaxring/collectives/csrc/cuda/device_ring.cu", "`debug`", "unset",
     "prints each CUDA ring's choice of engine and why"),
    ("NPROC", "jaxring/collectives/xla_threads.py", "threads",
     f"set by `import jaxring`: {xla_threads.THREADS_PER_DEVICE} per host device, or the cores if more",
     "the size of XLA's CPU thread pool; a value you set is kept (docs/USAGE.md, Steps in flight)"),
    ("XLA_FLAGS", "jaxring/collectives/xla_threads.py", "XLA's flags", "unset",
     "`--xla_force_host_platform_device_count=N` is read to size NPROC; `scripts/train.py --host-devices` "
     "adds it (jaxring/engine/launch.py)"),
    *[(name, "jaxring/engine/progress.py", "set by the launcher", "unset",
       "any of these present: the process runs under an MPI launcher (its status lines say so)")
      for name in progress.MPI_LAUNCHER_VARIABLES],
    ("GPU_CHECK_BUDGET_S", "scripts/gpu/gpu_check.sh", "seconds", _gpu_check_default("GPU_CHECK_BUDGET_S"),
     "one part's time budget; a stage gets the smaller of its limit and what is left"),
    ("GPU_CHECK_DRY_RUN", "scripts/gpu/gpu_check.sh", "`1`", _gpu_check_default("GPU_CHECK_DRY_RUN"),
     "on CPU: every command resolves and the CPU stages run, nothing else"),
    ("OUT", "scripts/gpu/gpu_check.sh", "a folder", f"`{_gpu_check_default('OUT')}`", "where the results go"),
    ("PYTHON", "scripts/gpu/gpu_check.sh", "a python", f"`{_gpu_check_default('PYTHON')}`", "the python that runs every stage"),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "scripts/gpu/check_cuda_ring.py", "a count", "32 (if unset)",
     "hardware queues for the virtual-rank harness's k streams; also scripts/gpu/bench_cuda_ring.py"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "scripts/gpu/check_cuda_ring.py", "`false`", "`false` (if unset)",
     "keeps JAX from taking the GPU's memory the harness needs"),
    ("JAX_PLATFORMS", "scripts/bench/cluster/cluster.py", "`cpu`, `cuda`", "`cpu` (if unset)",
     "the emulated cluster's processes run on CPU; also scripts/dev/lax_conformance.py's runs"),
    ("CUDA_HOME", "scripts/dev/sanitize_rnn_kernels.py", "a CUDA toolkit folder", f"`{_cuda_home_default()}`",
     "its `include/` holds the CUDA headers the ThreadSanitizer build of the RNN kernels compiles against"),
    ("PYTHONPATH", "scripts/dev/mutation_test.py", "paths", "inherited",
     "passed on to the test runs with the checkout first; also scripts/dev/lax_conformance.py"),
    ("PYTEST_XDIST_WORKER", "scripts/dev/lax_conformance.py", "set by pytest-xdist", "unset",
     "one record file per worker when JAX's tests run rebound"),
]


def first_paragraph(doc: str | None) -> str:
    return " ".join((inspect.cleandoc(doc or "").split("\n\n")[0]).split())


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def public_names() -> list[str]:
    """jaxring.__all__, and the functions jaxring's top level imports beside them (reserve_client_threads)."""
    imported = {name for name, value in vars(jaxring).items() if not name.startswith("_")
                and callable(value) and getattr(value, "__module__", "").startswith("jaxring.")}
    return sorted(set(jaxring.__all__) | imported)


def api_rows() -> list[str]:
    rows = ["| name | signature | what |", "|---|---|---|"]
    for name in public_names():
        value = getattr(jaxring, name)
        try:
            signature = str(inspect.signature(value))
        except (TypeError, ValueError):
            signature = ""
        kind = "class " if inspect.isclass(value) else ""
        rows.append(f"| `jaxring.{name}` | `{kind}{name}{cell(signature)}` | {cell(first_paragraph(value.__doc__))} |")
    return rows


def drop_in_rows() -> list[str]:
    """jaxring.mpi4jax's functions (importing it starts MPI: a world of this process)."""
    import jaxring.mpi4jax as drop_in

    rows = ["| name | signature | what |", "|---|---|---|"]
    for name in ("allreduce", "reduce", "allgather"):
        value = getattr(drop_in, name)
        rows.append(f"| `jaxring.mpi4jax.{name}` | `{name}{cell(str(inspect.signature(value)))}` | "
                    f"{cell(first_paragraph(value.__doc__))} |")
    return rows


# The engine's API a user calls or implements (docs/YOUR_MODEL.md): module -> names ("Class.method" for
# one method). The documented methods of SUBCLASSED get a row each: what a task implements or overrides.
ENGINE_API = {
    "jaxring.engine": ("run", "evaluate_run"),
    "jaxring.engine.registry": ("register",),
    "jaxring.engine.task": ("Task", "MetricNames", "Shard", "DataError"),
    "jaxring.engine.global_batches": ("GlobalBatches",),
    "jaxring.engine.nnx_task": ("NNXTask",),
    "jaxring.engine.trainer": ("Trainer", "Trainer.fit"),
}
SUBCLASSED = ("Task", "GlobalBatches")


def signature_of(value, name: str) -> str:
    """`name(arguments) -> result`, annotations as the source writes them (postponed ones unquoted)."""
    try:
        signature = str(inspect.signature(value))
    except (TypeError, ValueError):
        return name
    return name + re.sub(r"(: |-> )'([^']*)'", r"\1\2", re.sub(r"ForwardRef\('([^']*)'\)", r"\1", signature))


def engine_rows() -> list[str]:
    rows = ["| name | signature | what |", "|---|---|---|"]
    for module_name, names in ENGINE_API.items():
        module = importlib.import_module(module_name)
        for name in names:
            value = module
            for part in name.split("."):
                value = getattr(value, part)
            short = name.split(".")[-1]
            shown = "class " + signature_of(value, short) if inspect.isclass(value) else signature_of(value, short)
            if getattr(value, "_is_protocol", False):
                shown = f"class {name}(Protocol)"
            rows.append(f"| `{module_name}.{name}` | `{cell(shown)}` | {cell(first_paragraph(value.__doc__))} |")
            if name not in SUBCLASSED:
                continue
            for member, attribute in vars(value).items():
                function = attribute.__func__ if isinstance(attribute, (classmethod, staticmethod)) else attribute
                if member.startswith("_") or not callable(function) or not function.__doc__:
                    continue  # undocumented: the engine's own, not what a task writes
                rows.append(f"| `{module_name}.{name}.{member}` | `{cell(signature_of(function, member))}` | "
                            f"{cell(first_paragraph(function.__doc__))} |")
    return rows


def collectives_modules() -> list[str]:
    rows = ["| module | what |", "|---|---|"]
    for path in sorted((ROOT / "jaxring" / "collectives").glob("[a-z]*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        rows.append(f"| `jaxring.collectives.{path.stem}` | {cell(first_paragraph(docstring))} |")
    return rows


def environment_rows() -> list[str]:
    rows = ["| variable | read by | values | default | effect |", "|---|---|---|---|---|"]
    for name, reader, values, default, effect in ENVIRONMENT:
        rows.append(f"| `{name}` | {reader} | {values} | {default} | {effect} |")
    return rows


def config_rows() -> list[str]:
    rows = ["| owner | sections |", "|---|---|"]
    for owner, sections in config_reference.all_sections():
        rows.append(f"| {owner} | {', '.join(f'`{name}`' for name in sections)} |")
    return rows


def script_purpose(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".py":
        return first_paragraph(ast.get_docstring(ast.parse(text))).split(". ")[0].rstrip(".")
    comments = [line.lstrip("# ").strip() for line in text.splitlines()[1:] if line.startswith("#")]
    return " ".join(comments).split(". ")[0].split(":")[0].rstrip(".")


def script_rows() -> list[str]:
    rows = ["| script | what it is for |", "|---|---|"]
    # The user's commands (scripts/ itself) first, then the folders by role.
    for path in sorted((ROOT / "scripts").rglob("*"), key=lambda p: (p.parent != ROOT / "scripts", p)):
        if path.suffix in SCRIPT_SUFFIXES:
            rows.append(f"| `{path.relative_to(ROOT)}` | {cell(script_purpose(path))} |")
    return rows


HEADER = """# Reference

The names a user types: the public API, the environment variables, the config sections and the
scripts. Generated by `python scripts/docs/reference.py` from the code (docstrings, the table of
environment variables beside the code that reads them); tests/docs/test_reference.py keeps this
page equal to the code. Usage and examples: [USAGE.md](USAGE.md).
"""


def reference() -> str:
    parts = [
        HEADER,
        "## Public API (`import jaxring`)", "", *api_rows(), "",
        "## The engine and the task API (`jaxring.engine`)", "",
        "Training from Python, and what a task implements (docs/YOUR_MODEL.md).", "", *engine_rows(), "",
        "## mpi4jax's reductions (`import jaxring.mpi4jax as mpi4jax`)", "", *drop_in_rows(), "",
        "## Modules of `jaxring.collectives`", "", *collectives_modules(), "",
        "## Environment variables", "", *environment_rows(), "",
        "## Config sections", "",
        "Every key, its type, default and meaning: [CONFIG.md](CONFIG.md).", "", *config_rows(), "",
        "## Scripts", "", *script_rows(),
    ]
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 where docs/REFERENCE.md differs from the code")
    config_reference.write_or_check(OUTPUT, reference(), parser.parse_args().check, "scripts/docs/reference.py")


if __name__ == "__main__":
    main()
