"""The audit's layers: the pipeline's stages never reach into the runner around them."""

from __future__ import annotations

import ast
from pathlib import Path

import kvref.audit

AUDIT = Path(kvref.audit.__file__).parent
STAGES = ("pipeline.py", "discover", "summarise", "resolve", "rules", "fixes", "report")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_stage_imports_the_runner() -> None:
    for stage in STAGES:
        paths = [AUDIT / stage] if stage.endswith(".py") else sorted((AUDIT / stage).rglob("*.py"))
        for path in paths:
            runner = [name for name in imported_modules(path) if name.startswith("kvref.audit.runner")]
            assert not runner, f"{path.relative_to(AUDIT)} imports {runner}"
