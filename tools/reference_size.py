"""How much code kvref's CPU manager and cache policies take beside vLLM's same parts.

    .venv/bin/python tools/reference_size.py                # against vLLM 0.33.0
    .venv/bin/python tools/reference_size.py --vllm 0.34.0  # another release

The reference is read more than it is run, so it must not grow past the code it explains: kvref's
manager and policies stay within `MAX_RATIO` (1.2) times vLLM's code lines for the same parts.
A code line is a line holding a token of code: blank lines, comments and docstrings (of modules,
classes and functions, and bare string statements) do not count, so explaining more costs
nothing. vLLM's files are read from its sdist (fetched into kvref's cache outside the
repository), kvref's from the checkout. Prints one row per part and the total; exits 1 when the
total ratio is over `MAX_RATIO`.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._audit_corpus import fetch_corpus

__all__ = ["MAX_RATIO", "PARTS", "code_lines", "main", "sizes"]

CHECKOUT = Path(__file__).resolve().parent.parent
MAX_RATIO = 1.2
# vLLM's module -> kvref's modules doing the same job (kvref's ARC keeps its ghost lists in a
# module of their own).
PARTS: dict[str, tuple[str, ...]] = {
    "vllm/v1/kv_offload/cpu/manager.py": ("kvref/cpu/manager.py",),
    "vllm/v1/kv_offload/cpu/policies/base.py": ("kvref/cpu/policies/base.py",),
    "vllm/v1/kv_offload/cpu/policies/lru.py": ("kvref/cpu/policies/lru.py",),
    "vllm/v1/kv_offload/cpu/policies/arc.py": ("kvref/cpu/policies/arc.py", "kvref/cpu/policies/_ghosts.py"),
    "vllm/v1/kv_offload/cpu/policies/factory.py": ("kvref/cpu/policies/factory.py",),
}
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source: str) -> int:
    """Count the lines of `source` that hold code (not blank, comment or docstring lines)."""
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            end = node.end_lineno if node.end_lineno is not None else node.lineno
            docstring_lines.update(range(node.lineno, end + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines)


def sizes(vllm_root: Path, checkout: Path = CHECKOUT) -> list[tuple[str, int, int]]:
    """Return (vLLM module, its code lines, kvref's code lines for it), one per part."""
    return [
        (
            vllm_module,
            code_lines((vllm_root / vllm_module).read_text(encoding="utf-8")),
            sum(code_lines((checkout / module).read_text(encoding="utf-8")) for module in kvref_modules),
        )
        for vllm_module, kvref_modules in PARTS.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kvref's CPU manager and policies: code lines beside vLLM's.")
    parser.add_argument("--vllm", default="0.33.0", help="the vLLM release to compare with")
    args = parser.parse_args(argv)
    rows = sizes(fetch_corpus(f"vllm=={args.vllm}", log=False).root)
    print(f"| part (vLLM {args.vllm}) | vLLM code lines | kvref code lines | kvref / vLLM |")
    print("|---|---:|---:|---:|")
    for module, theirs, ours in rows:
        print(f"| {module.removeprefix('vllm/v1/kv_offload/')} | {theirs} | {ours} | {ours / theirs:.2f} |")
    theirs, ours = sum(row[1] for row in rows), sum(row[2] for row in rows)
    ratio = ours / theirs
    print(f"| total | {theirs} | {ours} | {ratio:.2f} |")
    print(f"kvref / vLLM: {ratio:.2f} (at most {MAX_RATIO})")
    return 0 if ratio <= MAX_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
