"""Byte counts on the command line: 4096, 1K, 64M, 1.5G (binary units, K = 1024).

The one parser of size arguments for the benchmark scripts; use it as an
argparse `type=`.
"""

import argparse
import re

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# A number, then an optional unit with an optional "iB"/"B" ("64M", "64MiB" and "64MB" are the same).
_SIZE = re.compile(r"(?P<number>\d+(\.\d*)?|\.\d+)\s*(?P<unit>[KMG]?)(I?B)?", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """The number of bytes `text` names; an argparse error that shows the accepted forms otherwise."""
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write bytes as e.g. 4096, 1K, 64M or 1.5G")
    size = float(match["number"]) * UNITS[match["unit"].upper()]
    if not size.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes ({size:g})")
    return int(size)
