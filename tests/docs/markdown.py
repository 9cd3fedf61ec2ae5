"""The code blocks and command lines of the Markdown docs, so tests run them as written."""

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)


def blocks(doc: str, language: str) -> list[str]:
    """The fenced blocks of ROOT/doc tagged `language` ("" for untagged ones), indentation removed."""
    found = []
    for indent, tag, body in _BLOCK.findall((ROOT / doc).read_text()):
        if tag == language:
            found.append("".join(line[len(indent):] + "\n" for line in body.splitlines()))
    return found


def command(doc: str, starts: str) -> list[str]:
    """The words of the one command line in a block of ROOT/doc that starts with `starts`
    (a trailing `# comment` dropped); an error if there is not exactly one."""
    lines = [line.strip() for block in blocks(doc, "") + blocks(doc, "sh") for line in block.splitlines()]
    matches = sorted({line for line in lines if line.startswith(starts)})
    assert len(matches) == 1, f"{doc}: expected one command line starting {starts!r}, found {matches}"
    return shlex.split(matches[0], comments=True)


# -- shell blocks and the markers above them

SHELL_TAGS = ("sh", "bash", "shell")
# The line directly above a shell block's opening fence, when the block is not run as written:
#   <!-- not run here: WHY; instead: COMMAND [&& COMMAND ...] -->   a cheaper form runs instead
#   <!-- run by tests/PATH.py -->                                    that test runs the block's commands
NOT_RUN = re.compile(r"^ *<!-- not run here: (?P<why>[^;]+?); instead: (?P<instead>.+?) -->$")
RUN_BY = re.compile(r"^ *<!-- run by (?P<test>tests/[\w/]+\.py) -->$")


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block of a doc: where it opens (1-based line), its tag, its text (indentation removed)
    and the marker comment directly above it ("" when there is none)."""

    doc: str
    line: int
    tag: str
    body: str
    marker: str

    def commands(self) -> list[str]:
        """Its command lines: continuation lines joined, comment lines dropped (a trailing `# comment`
        stays: the shell ignores it)."""
        joined = self.body.replace("\\\n", " ").splitlines()
        return [line.strip() for line in joined if line.strip() and not line.lstrip().startswith("#")]

    def instead(self) -> list[str]:
        """The cheaper commands a `not run here` marker gives."""
        found = NOT_RUN.match(self.marker)
        return [part.strip() for part in found.group("instead").split(" && ")] if found else []


def fenced_blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    found = []
    for match in _BLOCK.finditer(text):
        indent, tag, body = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        above = text.splitlines()[line - 2] if line > 1 else ""
        marker = above.strip() if above.strip().startswith("<!--") else ""
        found.append(Block(doc, line, tag, "".join(row[len(indent):] + "\n" for row in body.splitlines()), marker))
    return found
