"""make test's own scheduling: every test LONGEST_S names exists, or a renamed long test would
lose its early start without a word and the suite would wait for it alone at the end."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import LONGEST_S

ROOT = Path(__file__).resolve().parent.parent


def test_every_longest_test_names_a_test_that_exists():
    for name in LONGEST_S:
        path, _, rest = name.partition("::")
        assert (ROOT / path).is_file(), f"LONGEST_S: no file {path}"
        function = rest.split("[")[0]
        if function:
            tree = ast.parse((ROOT / path).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert function in defined, f"LONGEST_S: {path} has no {function}"
