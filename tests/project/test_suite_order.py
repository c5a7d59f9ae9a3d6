"""make test's own scheduling: every test LONGEST_S names exists, or a renamed long test would
lose its early start without a word and the suite would wait for it alone at the end."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def longest_tests() -> dict[str, int]:
    """tests/conftest.py's LONGEST_S, read from its source: `import conftest` may find another
    directory's conftest module (tests/operator has one)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        names = [getattr(target, "id", None) for target in getattr(node, "targets", [])]
        if names == ["LONGEST_S"]:
            return ast.literal_eval(node.value)
    raise AssertionError("tests/conftest.py has no LONGEST_S")


def test_every_longest_test_names_a_test_that_exists():
    for name in longest_tests():
        path, _, rest = name.partition("::")
        assert (ROOT / path).is_file(), f"LONGEST_S: no file {path}"
        function = rest.split("[")[0]
        if function:
            tree = ast.parse((ROOT / path).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert function in defined, f"LONGEST_S: {path} has no {function}"
