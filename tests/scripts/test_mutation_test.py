"""scripts/dev/mutation_test.py's mutant generator and module map, checked without running any mutant's tests."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "dev"))

import mutation_test  # noqa: E402

SOURCE = '''"""A module docstring: 1 < 2 and True."""
import os


def f(x, items):
    """Docstring lines are never mutated: 3 > 4."""
    if x < 3 and x not in items:
        items.append(x)
    total = x * 2 + 1.5
    flag = not items
    return total if flag is None else -total


def g(
    a,
    b,
):
    if a:
        return
    return (a) == (b) or os.sep
'''


def changed_lines(mutant):
    """(line number, original text, mutated text) of the one line `mutant` changes."""
    before, after = SOURCE.splitlines(), mutant.source.splitlines()
    assert len(before) == len(after)
    diffs = [(i + 1, a, b) for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(diffs) == 1, diffs
    return diffs[0]


def test_each_mutant_changes_one_line_compiles_and_the_classes_are_all_there():
    found = list(mutation_test.mutants(SOURCE))
    by_line = {}
    for mutant in found:
        line, _, after = changed_lines(mutant)
        assert line == mutant.line
        ast.parse(mutant.source)
        by_line.setdefault(line, {})[mutant.what] = after.strip()
    assert by_line[7] == {
        "< -> >=": "if x >= 3 and x not in items:",
        "not in -> in": "if x < 3 and x in items:",
        "3 -> 4": "if x < 4 and x not in items:",
        "and -> or": "if x < 3 or x not in items:",
    }
    assert by_line[8] == {"statement removed": "pass"}
    assert by_line[9] == {
        "* -> /": "total = x / 2 + 1.5",
        "+ -> -": "total = x * 2 - 1.5",
        "2 -> 3": "total = x * 3 + 1.5",
        "1.5 -> 3.0": "total = x * 2 + 3.0",
        "statement removed": "pass",
    }
    assert by_line[10] == {"not x -> x": "flag = (items)", "statement removed": "pass"}
    assert by_line[11] == {"is -> is not": "return total if flag is not None else -total", "return removed": "return None"}
    assert by_line[19] == {"return removed": "pass"}  # a bare return goes: the code falls through
    assert by_line[20] == {"== -> !=": "return (a) != (b) or os.sep", "or -> and": "return (a) == (b) and os.sep",
                           "return removed": "return None"}
    # docstrings, imports, the def lines, a bare name as a condition and a statement spread over lines are left alone
    assert set(by_line) == {7, 8, 9, 10, 11, 19, 20}
    assert sorted(m.line for m in found) == [m.line for m in found]


def test_every_mapped_module_and_test_path_exists():
    for module, args in mutation_test.TESTS.items():
        assert (ROOT / module).is_file(), module
        paths = [a for a in args if a.startswith("tests/")]
        assert paths and all((ROOT / p.split("::")[0]).exists() for p in paths), (module, args)  # a file or file::test


def test_a_module_without_mapped_tests_is_refused():
    import pytest

    with pytest.raises(SystemExit, match="no tests mapped for jaxring/engine/nowhere.py"):
        mutation_test.main(["jaxring/engine/nowhere.py", "--list"])
