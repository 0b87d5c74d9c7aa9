"""Write (or check) the rule tables of docs/CONFORMANCE.md from the conformance kit's docstrings.

    .venv-vllm/bin/python tools/conformance_rules.py          # rewrite the tables in place
    .venv-vllm/bin/python tools/conformance_rules.py --check  # exit 1 if they are stale

The tables sit between `<!-- rules:NAME -->` and `<!-- /rules:NAME -->` markers; each row is a
rule's id, its statement and what vLLM does when it is broken, read from the test's docstring,
so the page and the kit cannot say different things.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.testing.vllm import OffloadingManagerContract, SecondaryTierContract
from kvref.testing.vllm._common import Contract

__all__ = ["render", "main"]

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFORMANCE.md"
CONTRACTS: dict[str, type[Contract]] = {"tier": SecondaryTierContract, "manager": OffloadingManagerContract}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(contract: type[Contract]) -> str:
    lines = ["| rule (test `test_<rule>`) | the rule | when it is broken, in vLLM |", "| --- | --- | --- |"]
    for rule in contract.rules().values():
        lines.append(f"| `{rule.id}` | {_cell(rule.statement)} | {_cell(rule.in_vllm)} |")
    return "\n".join(lines)


def updated(text: str) -> str:
    for name, contract in CONTRACTS.items():
        pattern = re.compile(rf"(<!-- rules:{name} -->\n).*?(\n<!-- /rules:{name} -->)", re.DOTALL)
        text, count = pattern.subn(lambda m: m.group(1) + render(contract) + m.group(2), text)
        if count != 1:
            raise SystemExit(f"{DOC}: no (or more than one) <!-- rules:{name} --> section")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the tables are stale")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    fresh = updated(current)
    if args.check:
        if fresh != current:
            print(f"{DOC} is stale: run tools/conformance_rules.py")
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
