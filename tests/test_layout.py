"""The design's import direction, and the layering of `agents/` sub-packages, read from the code itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What each top-level package may import of ours (DESIGN.md, "Layout"); `agents` imports all of them.
MAY_IMPORT = {"schemas": set(), "compiler": {"schemas"}, "state": {"compiler", "schemas"}, "streams": {"schemas"}}
# agents' sub-packages, lowest first: each imports only those before it (and the top-level packages).
AGENTS_LAYERS = ["plans", "stream", "ops", "shards", "web", "worker", "cli"]


def imports(path: Path) -> set[str]:
    """Dotted names of our modules that a file imports (at any depth, TYPE_CHECKING blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in {*MAY_IMPORT, "agents"}}


def test_packages_import_one_way():
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for module in imports(path):
                top = module.split(".")[0]
                if top != package and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


def test_agents_sub_packages_import_only_the_layers_below_them():
    wrong = []
    for path in sorted((ROOT / "agents").rglob("*.py")):
        parts = path.relative_to(ROOT / "agents").parts
        layer = parts[0] if len(parts) > 1 else path.stem
        if layer == "__init__":
            continue
        if layer not in AGENTS_LAYERS:
            wrong.append(f"{path.relative_to(ROOT)} is in no layer: put it in a sub-package")
            continue
        below = set(AGENTS_LAYERS[:AGENTS_LAYERS.index(layer)])
        for module in imports(path):
            parts = module.split(".")
            if parts[0] == "agents" and len(parts) > 1 and parts[1] != layer and parts[1] not in below:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


def test_every_module_has_a_docstring_and_stays_under_400_lines():
    wrong = []
    for package in (*MAY_IMPORT, "agents"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if path.name != "__main__.py" and text.strip() and ast.get_docstring(ast.parse(text)) is None:
                wrong.append(f"{path.relative_to(ROOT)} has no docstring")
            if text.count("\n") >= 400:
                wrong.append(f"{path.relative_to(ROOT)} has {text.count(chr(10))} lines")
    assert wrong == []
