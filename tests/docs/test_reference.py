"""docs/REFERENCE.md is scripts/docs/reference.py's output, and its table of environment variables holds
every variable the code reads: found here by how the code reads them, independently of the table."""

import ast
import re
import subprocess
import sys

from tests.docs.markdown import ROOT

SCRIPT = ROOT / "scripts" / "docs" / "reference.py"
# How the code reads a variable: os.environ in its forms, getenv in C++, ${NAME:-default} in shell, a
# module constant naming one (timeout.py's ENV), a tuple of names checked together (progress.py's).
_READS = [
    r"environ(?:\.get|\.setdefault|\.pop)?\(\s*\"([A-Z][A-Z0-9_]+)\"",
    r"environ\[\"([A-Z][A-Z0-9_]+)\"\]",
    r"\"([A-Z][A-Z0-9_]+)\" in os\.environ",
    r"getenv\(\"([A-Z][A-Z0-9_]+)\"",
    r"\$\{([A-Z][A-Z0-9_]+):-",
    r"(?m)^ENV = \"([A-Z][A-Z0-9_]+)\"",
]
_NAME_TUPLE = re.compile(r"(?m)^[A-Z_]+_VARIABLES = \(([^)]*)\)")
_READERS = ("jaxring", "scripts")
_SOURCE_SUFFIXES = (".py", ".cc", ".cu", ".h", ".sh")


def variables_the_code_reads() -> dict[str, set[str]]:
    """Variable -> the files that read it, outside the test-only sources (csrc/testing)."""
    found: dict[str, set[str]] = {}
    for folder in _READERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in _SOURCE_SUFFIXES or "testing" in path.parts:
                continue
            text = path.read_text()
            names = {name for pattern in _READS for name in re.findall(pattern, text)}
            names |= {name for group in _NAME_TUPLE.findall(text) for name in ast.literal_eval(f"({group},)")}
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def table():
    sys.path.insert(0, str(SCRIPT.parent))
    import reference

    return reference.ENVIRONMENT


def test_the_page_is_what_the_script_writes_from_the_code():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_table_has_every_variable_the_code_reads_and_no_other():
    read = variables_the_code_reads()
    assert {"JAXRING_TIMEOUT_S", "JAXRING_CUDA_ENGINE", "NPROC", "PMIX_RANK", "GPU_CHECK_BUDGET_S"} <= set(read)
    listed = {name for name, *_ in table()}
    missing = {name: sorted(read[name]) for name in set(read) - listed}
    assert not missing, f"variables the code reads that scripts/docs/reference.py's ENVIRONMENT lacks: {missing}"
    assert not listed - set(read), f"ENVIRONMENT lists variables nothing reads: {listed - set(read)}"


def test_each_row_names_a_file_that_reads_it():
    read = variables_the_code_reads()
    wrong = [(name, reader) for name, reader, *_ in table() if reader not in read.get(name, ())]
    assert not wrong, f"(variable, the file ENVIRONMENT says reads it, but does not): {wrong}"


def test_every_public_name_and_script_is_on_the_page():
    page = (ROOT / "docs" / "REFERENCE.md").read_text()
    init = ast.parse((ROOT / "jaxring" / "__init__.py").read_text())
    imported = {alias.asname or alias.name for node in init.body if isinstance(node, ast.ImportFrom)
                for alias in node.names if not alias.name.startswith("_") and node.module.startswith("jaxring")}
    lazy = {key.value for node in init.body if isinstance(node, ast.Assign) and node.targets[0].id == "_LAZY"
            for key in node.value.keys}
    missing = [name for name in sorted(imported | lazy) if f"| `jaxring.{name}` |" not in page]
    assert not missing and "reserve_client_threads" in imported, missing
    scripts = [p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh")]
    assert all(f"| `{p.relative_to(ROOT)}` |" in page for p in scripts)


def engine_names_users_are_shown() -> set[str]:
    """jaxring.engine.MODULE.NAME for each name the examples import from the engine and each the docs name
    or import (`from jaxring.engine.task import MetricNames`, `jaxring.engine.registry.register`)."""
    texts = [p.read_text() for p in (ROOT / "examples").rglob("*.py")]
    texts += [p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if p.name != "REFERENCE.md"]
    found = set()
    for text in texts:
        for module, names in re.findall(r"from (jaxring\.engine(?:\.\w+)?) import ([\w, ]+)", text):
            found |= {f"{module}.{name.strip()}" for name in names.split(",") if not name.strip().startswith("_")}
        found |= set(re.findall(r"\b(jaxring\.engine\.[a-z_]+\.[A-Z]\w*|jaxring\.engine\.registry\.register)\b", text))
    return found


def test_the_engine_api_the_examples_and_docs_use_is_on_the_page():
    page = (ROOT / "docs" / "REFERENCE.md").read_text()
    shown = engine_names_users_are_shown()
    assert {"jaxring.engine.task.MetricNames", "jaxring.engine.registry.register", "jaxring.engine.task.Task",
            "jaxring.engine.global_batches.GlobalBatches"} <= shown, shown
    missing = sorted(name for name in shown | {"jaxring.engine.run", "jaxring.engine.evaluate_run"}
                     if f"| `{name}` |" not in page)
    assert not missing, f"engine names users are shown that docs/REFERENCE.md lacks (scripts/docs/reference.py's ENGINE_API): {missing}"
