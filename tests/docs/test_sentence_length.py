"""No sentence of the hand-written docs is longer than MAX_WORDS words, so a reader can follow each one.

What counts, in README.md and docs/*.md outside the generated pages (GENERATED) and fenced code blocks:
- a unit is a paragraph, a list item, a heading, or one table cell (each cell alone, split at
  unescaped pipes; the separator row is not text); a unit never runs into the next;
- a unit splits into sentences after ".", "?" or "!" (closing brackets, quotes and emphasis marks may
  follow) when a space and then a capital letter, a digit, a backtick, a bracket, a quote or an emphasis
  mark come next (a sentence that starts with a lower-case name counts with the one before it); an
  abbreviation (ABBREVIATIONS) ends no sentence, and a number like 1.5 has no space to split at;
- words are what whitespace separates, after a link becomes its text and an inline code span
  (`python scripts/x.py --flag`, a file path) becomes one word: a name is read as one thing."""

import re

import pytest

from tests.docs.test_docs_references import DOCS, prose

MAX_WORDS = 40
# A table cell longer than this is a paragraph in a cell: it belongs in the text under the table.
MAX_CELL_WORDS = 80
GENERATED = {"docs/REFERENCE.md", "docs/CONFIG.md"}
CELL_LIMITED = [doc for doc in DOCS if doc.count("/") <= 1 and doc not in GENERATED]
ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.", "etc.", "approx.", "no.")

_CODE_SPAN = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[.?!])[)\]\"'*_]*\s+(?=[A-Z`\[(\"*_0-9])")


def units(markdown: str) -> list[str]:
    """The paragraphs, list items, headings and table cells of `markdown` (fences already removed)."""
    found, current = [], []

    def close():
        if current:
            found.append(" ".join(current))
            current.clear()

    for line in _COMMENT.sub("", markdown).splitlines():
        stripped = line.strip()
        if not stripped:
            close()
        elif stripped.startswith("|"):
            close()
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", stripped.strip("|"))]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                found.extend(cells)
        elif stripped.startswith("#"):
            close()
            found.append(stripped.lstrip("#").strip())
        elif _LIST_ITEM.match(line):
            close()
            current.append(_LIST_ITEM.sub("", stripped))
        else:
            current.append(stripped)
    close()
    return found


def sentences(unit: str) -> list[str]:
    """The sentences of one unit, code spans and links already reduced (see the module's docstring)."""
    text = _LINK.sub(r"\1", _CODE_SPAN.sub("CODE", unit))
    pieces, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        before = text[start:end.start()].rstrip(")]\"'*_")
        if before.lower().endswith(ABBREVIATIONS):
            continue
        pieces.append(text[start:end.start()])
        start = end.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def long_sentences(doc: str) -> list[str]:
    return [f"{len(s.split())} words: {s}" for unit in units(prose(doc)) for s in sentences(unit)
            if len(s.split()) > MAX_WORDS]


def long_cells(markdown: str) -> list[str]:
    """The table cells of `markdown` (fences already removed) over MAX_CELL_WORDS words, counted as
    sentences count them (a code span or a link's text one word each)."""
    cells = [cell for line in markdown.splitlines() if line.strip().startswith("|") for cell in units(line)]
    return [f"{len(words)} words: {cell[:80]}..." for cell in cells
            if len(words := _LINK.sub(r"\1", _CODE_SPAN.sub("CODE", cell)).split()) > MAX_CELL_WORDS]


def test_the_splitter_follows_the_rules():
    assert units("A b.\nC d.\n\n- one\n- two\n  more\n| x | y \\| z |\n|---|:-:|\n# Head") == [
        "A b. C d.", "one", "two more", "x", "y \\| z", "Head"]
    assert sentences("It is 1.5 ms, e.g. at 4 KiB. Then `a.b c d` ran (see [x](y.md)). 3 ranks!") == [
        "It is 1.5 ms, e.g. at 4 KiB.", "Then CODE ran (see x).", "3 ranks!"]


@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.count("/") <= 1 and doc not in GENERATED])
def test_no_sentence_is_longer_than_the_limit(doc):
    long = long_sentences(doc)
    assert not long, (f"{doc}: {len(long)} sentences over {MAX_WORDS} words; split each (keep every fact, "
                      "number and file reference):\n" + "\n".join(long))


@pytest.mark.parametrize("doc", CELL_LIMITED)
def test_no_table_cell_is_longer_than_the_limit(doc):
    long = long_cells(prose(doc))
    assert not long, f"{doc}: table cells over {MAX_CELL_WORDS} words; move the detail under the table:\n" + "\n".join(long)


def test_a_cell_over_the_limit_is_found_and_one_at_it_is_not():
    at_limit, over = " ".join(["word"] * MAX_CELL_WORDS), "`a b` " + " ".join(["word"] * MAX_CELL_WORDS)
    assert long_cells(f"| x | {at_limit} |\n|---|---|\n| [a link](y.md) | {over} |") == [
        f"{MAX_CELL_WORDS + 1} words: {over[:80]}..."]
