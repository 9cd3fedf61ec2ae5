"""Every shell block of README.md and docs/*.md runs: as written, or, under a marker on the line above
its fence, a cheaper form of it (tests/docs/markdown.py, NOT_RUN), or by the test the marker names
(RUN_BY). Every command, marked or not, is checked without running it too: each file it names exists
and each config it names loads with its `--set` keys. The runs share one process
(tests/docs/command_runner.py) in a directory that mirrors the checkout, so what they write stays there."""

import ast
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.docs.markdown import NOT_RUN, ROOT, RUN_BY, SHELL_TAGS, fenced_blocks
from tests.docs.test_docs_references import _ENTRY_POINTS, DOCS, command_of, prose

BLOCKS = [block for doc in DOCS for block in fenced_blocks(doc)]
SHELL = [block for block in BLOCKS if block.tag in SHELL_TAGS]
# The page's placeholders for the checkout: $JAXRING (docs/YOUR_MODEL.md), /opt/jaxring (docs/MULTI_NODE.md).
CHECKOUT_PLACEHOLDERS = ("$JAXRING/", "/opt/jaxring/")
_PROGRAMS = {"make", "mpirun", "srun", "sudo", "git", "apt-get", "pip", "cd", "bash", "sh", "dpkg-deb",
             "jaxring-train", "jaxring-evaluate"}
# Words naming a file of the checkout, as a command's argument or a VAR=value's value.
_CHECKOUT_FILE = re.compile(r"^(?:configs|scripts|examples|models|docs)/[\w./-]*\.\w+$")
# The reader's own arguments: a line holding one cannot run as written.
_PLACEHOLDER_WORDS = ("...", "ARGS")


def words_of(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def where(block) -> str:
    return f"{block.doc}:{block.line}"


def is_command(line: str) -> bool:
    try:
        words = words_of(line)
    except ValueError:
        return False
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    return bool(words) and (command_of(words) is not None or words[0] in _PROGRAMS or words[0].endswith("python"))


def every_command():
    """(block, line) for each command a block shows and each cheaper form a marker gives."""
    for block in SHELL:
        for line in [*block.commands(), *block.instead()]:
            yield block, line


# -- what a block is

def test_the_docs_have_shell_blocks_of_each_kind():
    kinds = {"as written": 0, "not run": 0, "run by": 0}
    for block in SHELL:
        kinds["not run" if NOT_RUN.match(block.marker) else "run by" if RUN_BY.match(block.marker) else "as written"] += 1
    assert kinds["not run"] >= 5 and kinds["run by"] >= 3 and sum(kinds.values()) >= 20, kinds


def test_commands_are_in_shell_blocks():
    """A command in an untagged or text block would escape the runs: tag its block sh."""
    hidden = [(where(block), line) for block in BLOCKS if block.tag in ("", "text")
              for line in block.commands() if is_command(line)]
    assert not hidden, f"commands outside shell blocks (tag the block sh, or text if it is output): {hidden}"


def test_every_marker_is_one_of_the_two_forms():
    wrong = [(where(block), block.marker) for block in SHELL
             if block.marker and not (NOT_RUN.match(block.marker) or RUN_BY.match(block.marker))]
    assert not wrong, ("markers above shell blocks must read `<!-- not run here: WHY; instead: COMMAND -->` or "
                       f"`<!-- run by tests/PATH.py -->`: {wrong}")
    elsewhere = [(where(block), block.tag) for block in BLOCKS if block.tag not in SHELL_TAGS
                 and (NOT_RUN.match(block.marker) or RUN_BY.match(block.marker))]
    assert not elsewhere, f"run markers above blocks that are not shell blocks (tag them sh): {elsewhere}"


def string_literals(path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_a_block_run_elsewhere_is_read_by_that_test():
    """The named test exists, reads this doc, and picks each of the block's commands by a string of
    at least 12 characters that the command holds (as tests/docs/markdown.py's command() does)."""
    wrong = []
    for block in SHELL:
        found = RUN_BY.match(block.marker)
        if not found:
            continue
        test = ROOT / found.group("test")
        if not test.is_file():
            wrong.append((where(block), f"{test} does not exist"))
            continue
        literals = string_literals(test)
        if block.doc not in literals:
            wrong.append((where(block), f"{found.group('test')} never names {block.doc}"))
        wrong += [(where(block), f"no string of {found.group('test')} picks {line!r}") for line in block.commands()
                  if not any(len(s) >= 12 and s in line for s in literals)]
    assert not wrong, wrong


# -- checked without running

def checkout_path(word: str) -> str | None:
    for placeholder in CHECKOUT_PLACEHOLDERS:
        word = word.replace(placeholder, "")
    value = word.partition("=")[2] if re.match(r"^[A-Z_]+=", word) else word
    return value if _CHECKOUT_FILE.match(value) else None


def test_every_file_a_command_names_exists():
    missing = [(where(block), path) for block, line in every_command() for word in words_of(line)
               if (path := checkout_path(word)) and not (ROOT / path).exists()]
    assert not missing, f"commands naming files the checkout does not have (doc:line, file): {missing}"


def config_arguments(line: str) -> tuple[str | None, list[str]]:
    """(--config's value, the --set values) of a command line, TRAIN_FLAGS="..." of a make line included."""
    words = words_of(line)
    words += [w for word in words if word.startswith("TRAIN_FLAGS=") for w in shlex.split(word.partition("=")[2])]
    config, overrides = None, []
    for flag, value in zip(words, words[1:]):
        if flag == "--config":
            config = checkout_path(value) or value
        elif flag == "--set":
            overrides.append(value)
    if config is None and "make" in words and ("train" in words or overrides):
        config = "configs/ds2_tiny.yaml"  # the Makefile's train target
    return config, overrides


def test_every_config_a_command_names_loads_with_its_keys():
    """Each --config loads and validates with the line's --set values; a --set without a --config (a
    resumed run) names a key of some section the engine or a task has."""
    saved = list(sys.path)
    sys.path[:0] = [str(ROOT / "scripts" / "docs"), str(ROOT / "examples")]  # examples: as the commands' PYTHONPATH
    try:
        import config_reference
        from jaxring.engine import experiment

        keys = {f"{name}.{field}" for _, sections in config_reference.all_sections()
                for name, cls in sections.items() for field in cls.__dataclass_fields__}
        wrong, checked = [], 0
        for block, line in every_command():
            config, overrides = config_arguments(line)
            if config is None:
                wrong += [(where(block), value, "no such key") for value in overrides
                          if value.partition("=")[0] not in keys | {"task"}]
                continue
            if not config.endswith((".yaml", ".yml")) or "/" not in config:
                continue  # the reader's own config (mlp.yaml, written from the page's yaml block)
            checked += 1
            try:
                experiment.load_config(ROOT / config, overrides)
            except Exception as e:  # noqa: BLE001 - the finding
                wrong.append((where(block), line, f"{type(e).__name__}: {e}"))
    finally:
        sys.path[:] = saved
    assert not wrong, "commands whose config does not load (doc:line, command, why):\n" + "\n".join(map(str, wrong))
    assert checked >= 10, checked


def test_every_config_key_the_prose_names_exists():
    """A key in backticks (`data.corpus`, `train.allreduce_dtype: float16`) is a field of its section in
    the engine, a task of the checkout or an example; docs/MULTI_NODE.md named `data.source` once."""
    sys.path[:0] = [str(ROOT / "scripts" / "docs")]
    try:
        import config_reference
    finally:
        sys.path.pop(0)
    fields: dict[str, set[str]] = {}
    for _, sections in config_reference.all_sections():
        for name, cls in sections.items():
            fields.setdefault(name, set()).update(cls.__dataclass_fields__)
    named = re.compile(r"`(" + "|".join(fields) + r")\.(\w+)(?:[=: ][^`]*)?`")
    unknown = [(doc, found.group(0)) for doc in DOCS for found in named.finditer(prose(doc))
               if found.group(2) not in fields[found.group(1)]]
    assert not unknown, f"config keys the docs name that no section has (doc, text): {unknown}"
    assert named.search("`data.source`") and named.search("`train.allreduce_dtype: float16`")


# -- run

def mirror_checkout(tmp_path):
    """A directory whose entries are links to the checkout's (not runs/ and data/: what a command writes
    lands here)."""
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", "data", ".git"):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def runnable(block) -> list[str]:
    """The lines the test runs for `block`: its own when unmarked, the marker's cheaper ones, none when
    another test runs it."""
    if RUN_BY.match(block.marker):
        return []
    return block.instead() if NOT_RUN.match(block.marker) else block.commands()


def in_process(line: str, checkout) -> dict:
    """{"script", "args"} of a `python SCRIPT ... --help` line, or of an installed command's (its file in
    the venv is a Python script): the runner runs those in its own process; else no script."""
    words, found = words_of(line), command_of(words_of(line))
    if not (found and found[0] == "python" and {"--help", "-h"} & set(found[2])):
        return {"script": None, "args": []}
    if words[0] in ("python", "python3", ".venv/bin/python"):
        return {"script": str(checkout / found[1]), "args": found[2]}
    if words[0] in _ENTRY_POINTS:
        return {"script": str(checkout / ".venv" / "bin" / words[0]), "args": words[1:]}
    return {"script": None, "args": []}


def test_every_shell_block_runs_as_written_or_in_its_cheaper_form(tmp_path):
    (tmp_path / "checkout").mkdir()
    checkout = mirror_checkout(tmp_path / "checkout")
    commands, origin = [], {}
    for block in SHELL:
        for line in runnable(block):
            line = line.replace("{tmp}", str(tmp_path))
            placeholders = [w for w in words_of(line) if w in _PLACEHOLDER_WORDS]
            assert not placeholders, (f"{where(block)}: {line!r} holds the reader's own arguments: mark the block "
                                      "`<!-- not run here: WHY; instead: COMMAND -->`")
            commands.append({"line": line, **in_process(line, checkout)})
            origin[line] = where(block)
    assert len(commands) >= 20, commands
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "XLA_FLAGS"))}
    env.update(JAX_PLATFORMS="cpu", JAXRING=str(checkout), PYTHONPATH=str(ROOT),
               PATH=f"{checkout / '.venv' / 'bin'}:{env['PATH']}")
    (tmp_path / "commands.json").write_text(json.dumps(commands))
    runner = [sys.executable, str(ROOT / "tests/docs/command_runner.py"), str(tmp_path / "commands.json")]
    finished = subprocess.run(runner, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    results = json.loads(finished.stdout.splitlines()[-1])
    failed = [f"{origin[line]}: {line}\n    exit {code}: {output}" for line, code, output in results if code != 0]
    assert not failed, "documented commands that failed:\n" + "\n".join(failed)


@pytest.mark.parametrize("marker, instead", [
    ("<!-- not run here: a GPU; instead: python scripts/x.py --help -->", ["python scripts/x.py --help"]),
    ("<!-- not run here: hours; instead: make -n train && python a.py --workdir {tmp}/r -->",
     ["make -n train", "python a.py --workdir {tmp}/r"]),
])
def test_a_markers_cheaper_commands_are_read(marker, instead):
    from tests.docs.markdown import Block

    assert Block("d.md", 2, "sh", "make train\n", marker).instead() == instead
    assert RUN_BY.match("<!-- run by tests/scripts/test_multi_node.py -->")
    assert not NOT_RUN.match("<!-- not run here: no reason given -->")
