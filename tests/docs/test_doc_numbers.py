"""Every number of a claim in tests/docs/claims.py is what its JSON gives, to the digits the page shows:
a page that rounds 2.37 to 2.3, or quotes a range its JSON does not hold, fails here naming both."""

import re

import pytest

from tests.docs.claims import CLAIMS, STEP_8, Claim
from tests.docs.markdown import ROOT


def folded(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def agrees(shown: str, value) -> bool:
    """`shown` is `value` to its last digit (2.4 for 2.37; 15 for 15.3); a text value must be equal."""
    if isinstance(value, str):
        return shown == value
    decimals = len(shown.partition(".")[2])
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9


def checked(claim: Claim) -> list[str]:
    found = re.findall(claim.pattern, folded(claim.doc))
    assert len(found) == 1, f"{claim.doc}: expected the claim {claim.pattern!r} once, found it {len(found)} times"
    shown = found[0] if isinstance(found[0], tuple) else (found[0],)
    values = claim.values()
    assert len(values) == len(shown), (shown, values)
    return [f"{text} where {', '.join(claim.sources)} give {value if isinstance(value, str) else round(value, 4)}"
            for text, value in zip(shown, values) if not agrees(text, value)]


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.doc}:{c.pattern[:40]}")
def test_the_claim_is_what_its_json_gives(claim):
    wrong = checked(claim)
    assert not wrong, f"{claim.doc}: {claim.pattern!r}: " + "; ".join(wrong)


def test_a_number_agrees_only_to_the_digits_shown():
    assert agrees("2.4", 2.37) and agrees("5.7", 5.69) and agrees("15", 15.3) and agrees("0.92", 0.9151)
    assert not agrees("2.3", 2.37) and not agrees("5.2", 5.13) and not agrees("1.09", 0.71)
    assert agrees("32", 32) and not agrees("32", "30 of 32")


def test_a_wrong_number_fails():
    claim = Claim("README.md", r"\[([\d.]+)x and ([\d.]+)x\]\(docs/PERFORMANCE.md#the-training-step\)",
                  STEP_8, lambda *runs: (1.01, 0.97))
    assert checked(claim) and "1.01" in checked(claim)[0]


def readme_result_rows() -> list[str]:
    """The rows of README's "Is it faster?" table and of the training table after it."""
    section = (ROOT / "README.md").read_text().split("## Is it faster?")[1].split("\n## ")[0]
    return [" ".join(line.split()) for line in section.splitlines()
            if line.startswith("|") and not line.startswith(("|---", "| where, what |", "| what |"))]


def test_every_result_row_of_the_readme_has_a_claim():
    rows = readme_result_rows()
    patterns = [claim.pattern for claim in CLAIMS if claim.doc == "README.md"]
    bare = [row[:90] for row in rows if not any(re.search(pattern, row) for pattern in patterns)]
    assert len(rows) >= 12 and not bare, f"README result rows no claim in tests/docs/claims.py recomputes: {bare}"
