"""The rule registry keeps its conventions: fixtures, docstrings, size, messages as data."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import kvref.audit.rules as rules_package
from kvref.audit import ALL_RULES, Rule, get_rule
from kvref.audit.catalogue import FixSafety, doc_section

FIXTURES = Path(__file__).parent / "fixtures"
RULES_DIR = Path(rules_package.__file__).parent
SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety")


def test_codes_are_unique_ordered_and_named_after_the_pattern() -> None:
    codes = [rule.code for rule in ALL_RULES]
    assert codes == sorted(set(codes))
    for rule in ALL_RULES:
        assert re.fullmatch(r"KVR[01]\d\d", rule.code)
        assert re.fullmatch(r"[a-z]+(-[a-z]+)+", rule.name)
        assert not rule.name.startswith(("no-", "disallow", "banned"))
        assert get_rule(rule.code.lower()) is rule


def test_only_kvr103_is_off_by_default() -> None:
    assert [r.code for r in ALL_RULES if not r.default_enabled] == ["KVR103"]


def test_unknown_code_is_a_value_error_listing_the_codes() -> None:
    with pytest.raises(ValueError, match="KVR001"):
        get_rule("KVR999")


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_every_rule_has_a_fixture_and_fixable_iff_twin(rule: Rule) -> None:
    assert (FIXTURES / f"{rule.code}.py").is_file()
    assert rule.fixable == (FIXTURES / f"{rule.code}.fixed.py").is_file()


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_docstring_has_the_five_sections_in_order(rule: Rule) -> None:
    doc = inspect.getdoc(type(rule)) or ""
    found = [re.search(rf"^{re.escape(s)}:?$", doc, re.MULTILINE) for s in SECTIONS]
    positions = [m.start() if m else -1 for m in found]
    assert all(p >= 0 for p in positions), doc
    assert positions == sorted(positions)


def test_one_rule_class_per_module_of_at_most_150_lines() -> None:
    modules = sorted(RULES_DIR.glob("kvr*.py"))
    assert len(modules) == len(ALL_RULES)
    for module in modules:
        source = module.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 150, module.name
        tree = ast.parse(source)
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert len(classes) == 1, module.name
        code = module.name[:6].upper()
        assert any(type(r).__name__ == classes[0].name and r.code == code for r in ALL_RULES)


def test_messages_are_templates_not_f_strings_in_checks() -> None:
    for module in RULES_DIR.glob("kvr*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "check":
                assert not any(isinstance(n, ast.JoinedStr) for n in ast.walk(node)), module.name
    for rule in ALL_RULES:
        assert "{" in rule.message


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_declared_fix_safety_and_summary_agree_with_the_docstring(rule: Rule) -> None:
    doc = inspect.getdoc(type(rule)) or ""
    prose = doc_section(doc, "Fix safety").split(":", 1)[0].strip().lower()
    expected = {"safe": FixSafety.SAFE, "unsafe": FixSafety.UNSAFE, "no fix": FixSafety.NONE}
    assert expected[prose] is rule.fix_safety
    assert (rule.fix_title != "") == rule.fixable
    assert " ".join(doc.split("\n\n", 1)[0].split()) == rule.summary
