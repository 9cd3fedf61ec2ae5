"""No module of jaxring imports itself back through others, at module level or inside a function.

A circle makes the order modules load in matter and hides which idea sits above which;
one that only closes inside a function still couples the modules both ways. The graph is
read from the source (ast), so it holds the imports of every branch, not only the ones a
test happens to run. An edge goes to the module an import names: `from a import b` to the
submodule a.b where there is one, else to a. A package's __init__ that imports its own
submodules is not a circle: Python runs it before them, and the edge goes to the submodule.
"""

import ast
import pathlib

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[2] / "jaxring"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def imported(node, importer: str, is_package: bool, known) -> set[str]:
    """The modules of `known` that an Import or ImportFrom node of module `importer` names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:  # relative: from the importer's package, up level - 1 more
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = ".".join(filter(None, (package, node.module)))
    else:
        base = node.module
    targets = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        targets.add(submodule if submodule in known else base)
    return targets & set(known)


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(imported(node, name, is_package, known) for node in ast.walk(tree)
                                    if isinstance(node, (ast.Import, ast.ImportFrom))))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle, each starting at its smallest module, in order."""
    found = []

    def walk(start, node, path, on_path):
        for nxt in sorted(graph[node]):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in on_path:
                walk(start, nxt, path + [nxt], on_path | {nxt})

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return found


def test_the_graph_sees_imports_inside_functions_and_submodules_named_by_from():
    graph = import_graph()
    assert "jaxring.collectives.allreduce" in graph["jaxring"]  # from jaxring.collectives.allreduce import allreduce
    assert "jaxring.collectives.mpi" in graph["jaxring.collectives.across_processes"]  # inside _mpi: processes=True
    assert "jaxring.collectives.kinds" in graph["jaxring.collectives.ring_primitive"]  # from jaxring.collectives import kinds


def test_no_module_imports_itself_back():
    found = cycles(import_graph())
    assert not found, "import circles in jaxring:\n" + "\n".join(" -> ".join(cycle) for cycle in found)
