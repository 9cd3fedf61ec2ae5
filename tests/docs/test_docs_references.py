"""What the README and docs point at still holds: every docs/bench JSON a page names exists and the
index (docs/bench/README.md) lists every JSON there; every command line in a shell block names a
script that exists and takes the flags given (parsed, never run) or a make target the Makefile has;
every relative link resolves, its #anchor included; and the README and the long pages keep
within their line budgets (LINE_BUDGETS)."""

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from tests.docs.markdown import NOT_RUN, ROOT, RUN_BY, blocks

DOCS = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))]
BENCH = ROOT / "docs" / "bench"
INDEX = "docs/bench/README.md"
# Budgets never go up (issue 58): when content grows, the history moves to INDEX's evidence log.
LINE_BUDGETS = {"README.md": 110, "docs/ARCHITECTURE.md": 350, "docs/PERFORMANCE.md": 450, "docs/TRAINING.md": 450,
                "docs/USAGE.md": 350}
README_PARAGRAPH_LINES, SCREEN_COLUMNS = 6, 80

_FENCE = re.compile(r"^( *)```.*?^\1```", re.S | re.M)
_BENCH_PATH = re.compile(r"docs/bench/((?:[\w-]|\{[\w.,]*\})+\.jsonl?)")
_JSON_NAME = re.compile(r"(?<![\w-])\w[\w-]*\.jsonl?\b")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def text(doc: str) -> str:
    return (ROOT / doc).read_text()


def prose(doc: str) -> str:
    """The doc without its fenced blocks."""
    return _FENCE.sub("", text(doc))


def expand_braces(name: str) -> list[str]:
    """A shell brace pattern's names: run{1..3}.json, pair{7,8}.json."""
    found = re.search(r"\{([^{}]*)\}", name)
    if not found:
        return [name]
    body = found.group(1)
    if ".." in body:
        low, high = body.split("..")
        options = [str(i) for i in range(int(low), int(high) + 1)]
    else:
        options = body.split(",")
    return [each for option in options for each in expand_braces(name[:found.start()] + option + name[found.end():])]


def bench_files() -> set[str]:
    return {path.name for path in BENCH.iterdir() if path.suffix in (".json", ".jsonl")}


def test_every_bench_json_a_doc_names_exists():
    missing = [(doc, name) for doc in DOCS for pattern in _BENCH_PATH.findall(text(doc))
               for name in expand_braces(pattern) if not (BENCH / name).is_file()]
    assert not missing, f"docs name JSON that docs/bench does not hold (doc, file): {missing}"


def test_the_bench_index_lists_every_json_and_only_those():
    index = text(INDEX)
    unlisted = sorted(name for name in bench_files() if name not in index)
    assert not unlisted, (f"{INDEX} does not list these files of docs/bench; add a row (what it backs, its command, "
                          f"its machine): {unlisted}")
    stale = sorted(set(_JSON_NAME.findall(index)) - bench_files())
    assert not stale, f"{INDEX} names files docs/bench does not hold: {stale}"


# -- command lines

_PYTHONS = {"python", "python3", ".venv/bin/python"}
# An installed jaxring's commands (pyproject.toml's [project.scripts]): the checkout's scripts parse the same flags.
_ENTRY_POINTS = {"jaxring-train": "scripts/train.py", "jaxring-evaluate": "scripts/evaluate.py"}
_LAUNCHERS = {"mpirun", "srun"}
# Words that stand for the reader's own arguments.
_PLACEHOLDERS = {"...", "ARGS"}


def shell_lines(doc: str):
    for tag in ("", "sh", "bash", "shell"):
        for block in blocks(doc, tag):
            yield from block.replace("\\\n", " ").splitlines()


def command_of(words: list[str]):
    """('make', targets) or ('python', script path, arguments) for a documented command line, or
    None for a line that is neither (output, prose, another program)."""
    words = [w.replace("$JAXRING/", "") for w in words]
    base = ""
    while words:
        first = words[0]
        if re.fullmatch(r"[A-Z_]+=\S*", first) or first in ("sudo", "time", "/usr/bin/time", "-v"):
            words = words[1:]
        elif first in ("flock", "nice"):
            words = words[2:] if first == "flock" else words[3:]
        elif first == "cd" and len(words) > 2 and words[2] == "&&":
            base, words = words[1].rstrip("/") + "/", words[3:]
        else:
            break
    if not words:
        return None
    if words[0] == "make":
        return "make", [w for w in words[1:] if "=" not in w and not w.startswith("-")]
    if words[0] in _ENTRY_POINTS:
        return "python", _ENTRY_POINTS[words[0]], [w.strip("[]") for w in words[1:] if w not in _PLACEHOLDERS]
    if words[0] in _LAUNCHERS:
        for i, word in enumerate(words):
            if word in _PYTHONS:
                return command_of(words[i:])
            if word.startswith("CUDA_VISIBLE_DEVICES=") or " python" in word:
                return command_of(shlex.split(word))
        return None
    if words[0] not in _PYTHONS:
        return None
    rest = words[1:]
    if rest[:2] == ["-m", "mpi4py"]:
        rest = rest[2:]
    if not rest or rest[0].startswith("-"):  # python -m other, python -c
        return None
    script = base + rest[0]
    if not script.startswith(("scripts/", "examples/")):
        return None
    args = [w.strip("[]") for w in rest[1:] if w not in _PLACEHOLDERS]
    return "python", script, [w for w in args if w]


# A command in backticks inside prose, a list or a table: `python scripts/x.py --flag` or
# `scripts/x.py --flag` (a script named alone, without flags, is a name, not a command).
_INLINE_COMMAND = re.compile(r"`((?:[^`\n]*\bpython3? )[^`]*scripts/[^`]*|scripts/[\w/]+\.py [^`]+)`")


def inline_lines(doc: str):
    """The commands a doc gives in backticks outside its fenced blocks, one line each."""
    for span in _INLINE_COMMAND.findall(prose(doc)):
        words = span.split()
        if words[-1] == "...":  # the rest left out: what is given must parse
            words = words[:-2] if words[-2].startswith("-") else words[:-1]
        if words[-1].startswith("-"):  # a flag named, not a command
            continue
        line = " ".join(words)
        yield line if "python" in line else "python " + line


def documented_commands():
    for doc in DOCS:
        for line in [*shell_lines(doc), *inline_lines(doc)]:
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not a shell line (an unbalanced quote in an output sample)
                continue
            found = command_of(words)
            if found:
                yield doc, line.strip(), found


def test_the_docs_have_commands_to_check():
    commands = list(documented_commands())
    kinds = {found[0] for _, _, found in commands}
    assert kinds == {"make", "python"} and len(commands) > 40, commands


def test_every_documented_make_target_exists():
    makefile = text("Makefile")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    missing = [(doc, line) for doc, line, found in documented_commands()
               if found[0] == "make" and not set(found[1]) <= targets]
    assert not missing, f"make targets the Makefile does not have (doc, line): {missing}"


def test_every_documented_script_exists_and_takes_its_flags(tmp_path):
    """Each scripts/*.py or examples/*.py line's flags, parsed by the script's own argparse in one
    process (tests/docs/argparse_check.py); nothing is trained or benchmarked."""
    commands = [(doc, line, found[1:]) for doc, line, found in documented_commands() if found[0] == "python"]
    missing = [(doc, line) for doc, line, (script, _) in commands if not (ROOT / script).is_file()]
    assert not missing, f"documented scripts that do not exist (doc, line): {missing}"
    checked = sorted({(str(ROOT / script), tuple(args)) for _, _, (script, args) in commands})
    (tmp_path / "commands.json").write_text(json.dumps(checked))
    # evaluate.py and transcribe.py add the options of the task that trained --workdir: each
    # documented run directory is one of the speech task here (the others' options are the same).
    for _, args in checked:
        for flag, value in zip(args, args[1:]):
            if flag == "--workdir":
                (tmp_path / value).mkdir(parents=True, exist_ok=True)
                (tmp_path / value / "config.yaml").write_text("task: deepspeech2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    checker = [sys.executable, str(ROOT / "tests/docs/argparse_check.py"), str(tmp_path / "commands.json")]
    finished = subprocess.run(checker, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    failures = json.loads(finished.stdout.splitlines()[-1])
    where = {(str(ROOT / script), tuple(args)): f"{doc}: {line}" for doc, line, (script, args) in commands}
    assert not failures, "documented command lines their script no longer takes:\n" + "\n".join(
        f"{where[(script, tuple(args))]}\n    {why}" for script, args, why in failures)


def test_a_command_line_is_found_in_each_form_the_docs_use():
    assert command_of(shlex.split("cd scripts/bench && flock /tmp/l python bench_allreduce_mpi.py --procs 2")) == (
        "python", "scripts/bench/bench_allreduce_mpi.py", ["--procs", "2"])
    assert command_of(shlex.split("sudo .venv/bin/python scripts/bench/cluster/cluster.py --nodes 2 -- python x.py")) == (
        "python", "scripts/bench/cluster/cluster.py", ["--nodes", "2", "--", "python", "x.py"])
    assert command_of(shlex.split("mpirun -np 2 --host a:1 python -m mpi4py scripts/train.py ... [--resume]")) == (
        "python", "scripts/train.py", ["--resume"])
    assert command_of(shlex.split("/usr/bin/time make train TRAIN_FLAGS=--resume")) == ("make", ["train"])
    assert command_of(shlex.split("jaxring-evaluate --workdir runs/mlp")) == (
        "python", "scripts/evaluate.py", ["--workdir", "runs/mlp"])
    assert command_of(shlex.split("test CER 12.33% WER 30.15% (greedy)")) is None


# -- links and budgets

def github_anchors(doc: str) -> set[str]:
    """The #anchors GitHub gives the doc's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose(doc), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        numbered, n = slug, 0
        while numbered in anchors:
            n += 1
            numbered = f"{slug}-{n}"
        anchors.add(numbered)
    return anchors


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCS:
        for target in _LINK.findall(prose(doc)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = ((ROOT / doc).parent / path).resolve() if path else ROOT / doc
            if not resolved.exists():
                broken.append((doc, target, "no such file"))
            elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(str(resolved.relative_to(ROOT))):
                broken.append((doc, target, "no such heading"))
    assert not broken, f"links that do not resolve (doc, link, why): {broken}"


def test_the_anchors_follow_githubs_rule():
    assert "result-make-train" in github_anchors("docs/TRAINING.md")
    assert "across-processes-against-mpi_allreduce-mpi4jax-and-gloo" in github_anchors("docs/PERFORMANCE.md")


@pytest.mark.parametrize("doc", sorted(LINE_BUDGETS))
def test_the_page_fits_its_line_budget(doc):
    # The marker above a shell block (tests/docs/markdown.py) is no line a reader sees.
    lines = len([line for line in text(doc).splitlines() if not (NOT_RUN.match(line) or RUN_BY.match(line))])
    assert lines <= LINE_BUDGETS[doc], (
        f"{doc} has {lines} lines, over its budget of {LINE_BUDGETS[doc]}: state today's result once and move "
        f"the history to {INDEX}'s evidence log")


def test_no_readme_paragraph_is_longer_than_six_screen_lines():
    paragraphs = re.split(r"\n\s*\n|\n(?=- )", prose("README.md"))
    long = [p for p in paragraphs if p.strip() and not p.lstrip().startswith(("|", "#"))
            and len(textwrap.wrap(" ".join(p.split()), SCREEN_COLUMNS)) > README_PARAGRAPH_LINES]
    assert not long, f"README paragraphs over {README_PARAGRAPH_LINES} lines of {SCREEN_COLUMNS} columns: {long}"
