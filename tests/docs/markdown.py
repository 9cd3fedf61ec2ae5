"""The code blocks and command lines of the Markdown docs, so tests run them as written."""

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
