"""Facts the docs state about the code, read from the code: scripts/gpu/gpu_check.sh's parts, stages
and limits; the pip extras and what they install (pyproject.toml); and the constants in DOCUMENTED
(bucket sizes, timeouts, thread counts, one-shot limits...), so that changing one fails here until
the page says the new value."""

import re
import tomllib

import pytest

from tests.docs.markdown import ROOT
from tests.docs.test_docs_references import DOCS, prose

# -- scripts/gpu/gpu_check.sh

GPU_CHECK = (ROOT / "scripts" / "gpu" / "gpu_check.sh").read_text()
_STAGE_CALL = re.compile(r"(?:^|\s)stage\s+\"?([\w$-]+)\"?\s+(?:gpu|cpu|build)\s+(?:--expect-fail\s+\"[^\"]*\"\s+)?(\d+)")
_FUNCTION = re.compile(r"^(\w+)\(\) \{\n(.*?)^\}", re.S | re.M)
_PART_BRANCH = re.compile(r'^(?:if|elif) \[ "\$PART" = (\d) \]; then$|^else$|^fi$', re.M)
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}


def stages_in(text: str, functions: dict[str, str]) -> dict[str, int]:
    """Stage name -> limit in seconds, for the stage calls of `text` and of the functions it calls."""
    found = {}
    for line in text.splitlines():
        for name, limit in _STAGE_CALL.findall(line):
            loop = re.search(r"for (\w+) in ([\w ]+); do", text)
            if "$" in name and loop:  # stage "jax-$engine" inside `for engine in host device`
                found.update({name.replace(f"${loop.group(1)}", v): int(limit) for v in loop.group(2).split()})
            else:
                found[name] = int(limit)
        called = line.strip()
        if called in functions:
            found.update(stages_in(functions[called], functions))
    return found


def gpu_check_parts() -> dict[int, dict[str, int]]:
    """Each part of scripts/gpu/gpu_check.sh: its stages and their limits (the build runs in every part)."""
    parts = sorted(int(p) for p in re.findall(r'"\$PART" != (\d)', GPU_CHECK))
    functions = dict(_FUNCTION.findall(GPU_CHECK))
    body = _FUNCTION.sub("", GPU_CHECK)
    start = re.search(r'^if \[ "\$PART" = ', body, re.M).start()
    branches = list(_PART_BRANCH.finditer(body, start))
    branches = branches[:next(i for i, b in enumerate(branches) if b.group(0) == "fi") + 1]
    common = stages_in(body[:start], functions)
    found = {}
    for branch, following in zip(branches, branches[1:]):
        part = int(branch.group(1)) if branch.group(1) else next(p for p in parts if p not in found)
        found[part] = {**common, **stages_in(body[branch.end():following.start()], functions)}
    assert sorted(found) == parts, (found, parts)
    return found


PARTS = gpu_check_parts()
STAGE_PART = {name: part for part, stages in PARTS.items() for name in stages if name != "build"}
BUDGET_S = int(re.search(r'GPU_CHECK_BUDGET_S:-(\d+)', GPU_CHECK).group(1))


def flat_prose(doc: str) -> str:
    return " ".join(prose(doc).split())


def test_the_script_is_read_as_it_runs():
    assert sorted(PARTS) == [1, 2, 3, 4]
    assert PARTS[1]["persistent-rnn-parity"] == 100 and STAGE_PART["persistent-rnn"] == 4
    assert {"jax-host", "jax-device", "jax-bad-engine"} <= set(PARTS[2])
    assert all(sum(stages.values()) <= BUDGET_S for stages in PARTS.values())


def test_every_gpu_check_part_a_doc_names_exists():
    wrong = [(doc, found) for doc in DOCS for found in re.findall(r"gpu_check\.sh`? (\d)\b", flat_prose(doc))
             if int(found) not in PARTS]
    assert not wrong, f"docs name parts scripts/gpu/gpu_check.sh does not have (doc, part): {wrong}"


def test_the_docs_count_gpu_check_calls_as_the_script_has_parts():
    count = NUMBER_WORDS[len(PARTS)]
    wrong = [(doc, m.group(0)) for doc in DOCS
             for m in re.finditer(r"\b(\w+) calls of at most 10 minutes", flat_prose(doc)) if m.group(1) != count]
    assert not wrong, f"scripts/gpu/gpu_check.sh has {count} parts (one call each); docs say otherwise: {wrong}"


def stage_mentions(doc: str):
    """(part the doc gives, stage name, limit the doc gives or None) for each stage named with its part."""
    text = flat_prose(doc)
    for part, names in re.findall(r"\bpart (\d)(?:'s)?:? ((?:[^.;()`]*?`[\w-]+`)+)", text, re.I):
        for name in re.findall(r"`([\w-]+)`", names):
            yield int(part), name, None
    for name, part in re.findall(r"`([\w-]+)`,? in part (\d)", text):
        yield int(part), name, None
    for name, limit, part in re.findall(r"`([\w-]+)` \((\d+) s(?:, part (\d))?", text):
        yield int(part) if part else None, name, int(limit)


def test_every_stage_a_doc_places_is_in_that_part_with_that_limit():
    wrong, checked = [], 0
    for doc in DOCS:
        for part, name, limit in stage_mentions(doc):
            if name not in STAGE_PART:
                continue
            checked += 1
            if part is not None and STAGE_PART[name] != part:
                wrong.append((doc, name, f"said part {part}, is in part {STAGE_PART[name]}"))
            if limit is not None and PARTS[STAGE_PART[name]][name] != limit:
                wrong.append((doc, name, f"said {limit} s, its limit is {PARTS[STAGE_PART[name]][name]} s"))
    assert not wrong, f"stages of scripts/gpu/gpu_check.sh the docs misplace: {wrong}"
    assert checked >= 5, "the docs' stage mentions are no longer found: update stage_mentions"


def test_the_part_limit_sums_the_docs_give_are_the_scripts():
    wrong = [(doc, m.group(0), sum(PARTS[int(m.group(1))].values())) for doc in DOCS
             for m in re.finditer(r"Part (\d)'s limits add up to (\d+) s", flat_prose(doc))
             if sum(PARTS[int(m.group(1))].values()) != int(m.group(2))]
    assert not wrong, f"(doc, sentence, the script's sum): {wrong}"


# -- pip extras

EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def requirement_names(extra: str) -> set[str]:
    return {re.match(r"[\w.-]+", requirement).group(0).lower() for requirement in EXTRAS[extra]}


def named_extras(doc: str):
    """(extra, packages the doc says it installs, or an empty list) for each extra a doc names."""
    text = " ".join((ROOT / doc).read_text().split())
    for extra, listed in re.findall(r"\[(\w+)\]['\"]?`?(?:: | \()((?:[\w-]+, )*[\w-]+)\)", text):
        yield extra, listed.split(", ")
    for extra in re.findall(r"(?:\.|jaxring)\[(\w+)\]", text):
        yield extra, []
    for extra, package in re.findall(r"the `(\w+)` extra installs ([\w-]+)", text):
        yield extra, [package]
    for extra in re.findall(r"the extra `(\w+)`|the `(\w+)` extra", text):
        yield next(e for e in extra if e), []


def test_every_extra_a_doc_names_is_in_pyproject_with_what_it_lists():
    wrong, checked = [], 0
    for doc in [*DOCS, "Makefile"]:
        for extra, packages in named_extras(doc):
            checked += 1
            if extra not in EXTRAS:
                wrong.append((doc, extra, f"no such extra; pyproject.toml has {sorted(EXTRAS)}"))
            elif not {p.lower() for p in packages} <= requirement_names(extra):
                wrong.append((doc, extra, f"{packages} not all in {sorted(requirement_names(extra))}"))
    assert not wrong, f"extras the docs get wrong (doc, extra, why): {wrong}"
    assert checked >= 4, "the docs' extras are no longer found: update named_extras"


# -- constants

def _cpp_constant(path: str, pattern: str) -> int:
    return int(re.search(pattern, (ROOT / "jaxring/collectives/csrc" / path).read_text()).group(1))


def _mib(value: int) -> str:
    return f"{value >> 20} MiB" if value >= 1 << 20 else f"{value >> 10} KiB"


def _documented():
    """(doc, pattern whose group is the documented value, the value the code holds, as written)."""
    from jaxring.collectives import fusion, mpi, timeout, xla_threads
    from jaxring.engine import trainer
    one_shot = re.search(r"ranks == 2 \? (\d+) << 10 : (\d+) << 20",
                         (ROOT / "jaxring/collectives/csrc/cuda/device_ring.cu").read_text())
    return [
        ("docs/USAGE.md", r"`STEPS_IN_FLIGHT` \((\d+)", str(trainer.STEPS_IN_FLIGHT)),
        ("docs/USAGE.md", r"- else (\d+) s\.", f"{timeout.FALLBACK_S:g}"),
        ("docs/ARCHITECTURE.md", r"`JAXRING_TIMEOUT_S`, default (\d+) s", f"{timeout.FALLBACK_S:g}"),
        ("docs/USAGE.md", r"to (\d+) threads per host device", str(xla_threads.THREADS_PER_DEVICE)),
        ("docs/ARCHITECTURE.md", r"one per platform: (\d+ [KM]iB) CPU", _mib(fusion.DEFAULT_BUCKET_BYTES["cpu"])),
        ("docs/ARCHITECTURE.md", r"(\d+ [KM]iB) GPU\)", _mib(fusion.DEFAULT_BUCKET_BYTES["gpu"])),
        ("docs/ARCHITECTURE.md", r"Up to (\d+ [KM]iB) per device, one-shot", _mib(mpi.ONE_SHOT_MAX_BYTES)),
        ("docs/COLLECTIVES.md", r"up to (\d+ [KM]iB) per device every", _mib(mpi.ONE_SHOT_MAX_BYTES)),
        ("docs/ARCHITECTURE.md", r"Up to (\d+ [KM]iB) over 4, 8", _mib(mpi.DOUBLING_MAX_BYTES)),
        ("docs/ARCHITECTURE.md", r"in pieces of at most (\d+) B",
         str(_cpp_constant("mpi/mpi_host_ring.cc", r"kEagerPieceBytes = (\d+)"))),
        ("docs/ARCHITECTURE.md", r"yielding the core only after (\d+) us",
         str(_cpp_constant("mpi/mpi_ring.h", r"kDefaultLegSpinUs = (\d+)"))),
        ("docs/ARCHITECTURE.md", r"pieces of (\d+ [KM]iB)", _mib(mpi.PIECE_BYTES)),
        ("docs/COLLECTIVES.md", r"processes in (\d+ [KM]iB) pieces", _mib(mpi.PIECE_BYTES)),
        ("docs/COLLECTIVES.md", r"buffers up to (\d+ [KM]iB) at 2 ranks", _mib(int(one_shot.group(1)) << 10)),
        ("docs/COLLECTIVES.md", r"at 2 ranks and (\d+ [KM]iB) from 3", _mib(int(one_shot.group(2)) << 20)),
        ("docs/COLLECTIVES.md", r"more than (\d+) ranks, fall back",
         str(_cpp_constant("core/ring_protocol.h", r"kMaxDeviceRanks = (\d+)"))),
        ("docs/CUDA_RING.md", r"at most (\d+) ranks and every pair",
         str(_cpp_constant("core/ring_protocol.h", r"kMaxDeviceRanks = (\d+)"))),
        ("docs/CUDA_RING.md", r"\((\d+) s less the summary's", str(BUDGET_S)),
        ("docs/PERSISTENT_RNN.md", r"its (\d+) s budget", str(BUDGET_S)),
    ]


@pytest.mark.parametrize("doc, pattern, value", _documented())
def test_a_documented_constant_is_the_codes(doc, pattern, value):
    found = re.findall(pattern, " ".join((ROOT / doc).read_text().split()))
    assert found, f"{doc} no longer says {pattern!r}: update this table (tests/docs/test_docs_facts.py)"
    assert set(found) == {value}, f"{doc} says {found} for {pattern!r}; the code holds {value}"


# -- ratios: one direction everywhere (README's "Is it faster?": > 1 means jaxring is faster)

_INVERTED_RATIOS = [r"\(< 1: faster\)", r"\| [^|]*jaxring ?/ ?(?:bare|psum|mpi|gloo)[^|]*\|",
                    r"time over the bare call's"]


def text_of(doc: str) -> str:
    return (ROOT / doc).read_text()


def test_no_page_gives_a_ratio_the_other_way_round():
    wrong = [(doc, m.group(0)) for doc in DOCS for pattern in _INVERTED_RATIOS
             for m in re.finditer(pattern, text_of(doc))]
    assert not wrong, f"ratios where < 1 means jaxring is faster; turn them round (other's time over jaxring's): {wrong}"
