"""KVR102's pass counting follows the paths a function can take.

Scenarios first (each a small function and the passes expected), then generated function
bodies checked against a brute-force model: every path through the body is enumerated (loops
run any number of times) and the parameter is reported exactly when some path consumes it twice.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.audit import analyze
from kvref.audit.summarise.passes import count_passes
from kvref.audit.summarise.records import MultiPass
from kvref.audit.summarise.summary import summarize


def passes(body: str) -> tuple[int, int, int] | None:
    """(first line, second line, loop line) of `xs` in a function with this body, or None.

    Line 1 is the `def`, so the body's first line is line 2.
    """
    source = "def f(xs, ys, flag, other):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    found = count_passes(function.body, {"xs"})
    if "xs" not in found:
        return None
    first, second = found["xs"]
    return first.line, second.line, second.loop_line


# --- exclusive paths are not added up ---------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("if flag:\n    a = sum(xs)\nelse:\n    a = max(xs)\n", id="if-else arms"),
        pytest.param("a = sum(xs) if flag else max(xs)\n", id="conditional expression"),
        pytest.param(
            "match flag:\n    case 1:\n        a = sum(xs)\n    case _:\n        a = max(xs)\n",
            id="match cases",
        ),
        pytest.param("if flag:\n    return list(xs)\nfor x in xs:\n    pass\n", id="early return"),
        pytest.param("if not xs:\n    raise ValueError\n", id="one test"),
        pytest.param("if flag:\n    raise ValueError(sorted(xs))\nreturn sum(xs)\n", id="raise ends it"),
        pytest.param(
            "try:\n    return len(xs)\nexcept TypeError:\n    return len(list(xs))\n",
            id="try and handler",
        ),
        pytest.param(
            "for y in ys:\n    if y:\n        return sum(xs)\n", id="return inside a loop"
        ),
        pytest.param(
            "for y in ys:\n    if y:\n        a = sum(xs)\n        break\n", id="break after the pass"
        ),
        pytest.param("while True:\n    a = sum(xs)\n    break\n", id="while True with break"),
        pytest.param("xs = list(xs)\na = sum(xs) + len(xs)\n", id="rebound"),
        pytest.param(
            "if flag:\n    xs = list(xs)\nelse:\n    xs = tuple(xs)\nreturn sum(xs), max(xs)\n",
            id="rebound in every arm",
        ),
    ],
)
def test_exclusive_paths_are_one_pass(body: str) -> None:
    assert passes(body) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param("for x in xs:\n    pass\nif flag:\n    return sum(xs)\n", (2, 5, 0), id="loop then early return"),
        pytest.param("a = sum(xs)\nb = max(xs)\n", (2, 3, 0), id="two statements"),
        pytest.param("if flag:\n    a = sum(xs)\nb = max(xs)\n", (3, 4, 0), id="if without else, then more"),
        pytest.param("if flag:\n    xs = list(xs)\nreturn sum(xs), max(xs)\n", (4, 4, 0), id="rebound on one arm"),
        pytest.param("return list(zip(xs, xs))\n", (2, 2, 0), id="twice on one line"),
        pytest.param("for y in ys:\n    a = sum(xs)\n", (3, 3, 2), id="a pass in a loop body"),
        pytest.param("return [y for y in ys if y in xs]\n", (2, 2, 2), id="a pass per comprehension element"),
        pytest.param("while sum(xs) < 10:\n    pass\n", (2, 2, 2), id="a while test"),
        pytest.param(
            "for y in ys:\n    if y:\n        continue\n    a = sum(xs)\n", (5, 5, 2), id="continue skips only one iteration"
        ),
        pytest.param(
            "try:\n    a = sum(xs)\nexcept TypeError:\n    pass\nb = max(xs)\n", (3, 6, 0), id="after a try"
        ),
        pytest.param(
            "if flag:\n    for x in xs:\n        pass\nelse:\n    a = 1\nreturn max(xs)\n", (3, 7, 0), id="worst arm, then more"
        ),
    ],
)
def test_passes_on_one_path_are_reported(body: str, expected: tuple[int, int, int]) -> None:
    assert passes(body) == expected


def test_pathological_nesting_finishes() -> None:
    body = "".join("    " * depth + f"for v{depth} in ys:\n" for depth in range(40))
    body += "    " * 40 + "a = sum(xs)\n"
    assert passes(body) is not None


# --- the message names two distinct lines ----------------------------------------------------


def _message(tmp_path: Path, body: str) -> str:
    path = tmp_path / "m.py"
    header = "from collections.abc import Iterable\n\n\ndef f(xs: Iterable[int], ys: list[int]) -> object:\n"
    path.write_text(header + textwrap.indent(textwrap.dedent(body), "    "), encoding="utf-8")
    findings = analyze([path], root=tmp_path).findings
    assert [f.code for f in findings] == ["KVR102"]
    return findings[0].message


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("a = sum(xs)\nreturn max(xs)\n", "(lines 5 and 6)"),
        ("return list(zip(xs, xs))\n", "(twice on line 5)"),
        ("for y in ys:\n    a = sum(xs)\n", "(on line 6, again on each iteration of the loop on line 5)"),
        ("return [y for y in ys if y in xs]\n", "(on line 5, once per iteration of the loop there)"),
    ],
)
def test_message_never_repeats_a_line(tmp_path: Path, body: str, where: str) -> None:
    message = _message(tmp_path, body)
    assert f"consumed more than once {where};" in message
    pair = re.search(r"lines (\d+) and (\d+)", message)
    assert pair is None or pair.group(1) != pair.group(2)


def test_summary_records_the_loop_line() -> None:
    source = b"from typing import Iterable\n\ndef f(xs: Iterable[int], ys: list[int]) -> None:\n    for y in ys:\n        print(sum(xs))\n"
    (function,) = summarize("m.py", source).functions
    assert function.multi_pass == (MultiPass("xs", "Iterable[int]", 5, 5, 4),)


# --- generated bodies against a brute-force model of every path -------------------------------


@dataclass(frozen=True)
class Stmt:
    """A statement of the generated language (see `render`)."""

    kind: str
    body: tuple[Stmt, ...] = ()
    orelse: tuple[Stmt, ...] = ()


LEAVES = ("use", "other", "return_use", "return", "raise", "use_either", "rebind")
LOOP_LEAVES = ("break", "continue")


def statements(in_loop: bool) -> st.SearchStrategy[tuple[Stmt, ...]]:
    leaves = LEAVES + (LOOP_LEAVES if in_loop else ())
    leaf = st.sampled_from(leaves).map(Stmt)

    def blocks(inner: st.SearchStrategy[Stmt]) -> st.SearchStrategy[Stmt]:
        block: st.SearchStrategy[tuple[Stmt, ...]] = st.lists(inner, min_size=1, max_size=3).map(tuple)
        empty: st.SearchStrategy[tuple[Stmt, ...]] = st.just(())

        def compound(kind: str, else_block: st.SearchStrategy[tuple[Stmt, ...]]) -> st.SearchStrategy[Stmt]:
            return st.tuples(block, else_block).map(lambda arms: Stmt(kind, arms[0], arms[1]))

        return st.one_of(
            compound("if", st.one_of(empty, block)), compound("try", block), compound("match", block)
        )

    tree = st.recursive(leaf, blocks, max_leaves=8)
    if not in_loop:
        loop_body = st.lists(
            st.recursive(st.sampled_from(leaves + LOOP_LEAVES).map(Stmt), blocks, max_leaves=5),
            min_size=1,
            max_size=3,
        ).map(tuple)
        tree = st.one_of(tree, loop_body.map(lambda b: Stmt("for", b)))
    return st.lists(tree, min_size=1, max_size=4).map(tuple)


LEAF_SOURCE = {
    "use": "total += sum(xs)",
    "other": "total += 1",
    "return_use": "return sum(xs)",
    "return": "return total",
    "raise": "raise ValueError(total)",
    "use_either": "total += sum(xs) if flag else max(xs)",
    "rebind": "xs = [1, 2]",
    "break": "break",
    "continue": "continue",
}


def render(block: tuple[Stmt, ...], indent: str = "    ") -> str:
    lines: list[str] = []
    for statement in block:
        if statement.kind in LEAF_SOURCE:
            lines.append(indent + LEAF_SOURCE[statement.kind])
        elif statement.kind == "if":
            lines.append(f"{indent}if flag:")
            lines.append(render(statement.body, indent + "    "))
            if statement.orelse:
                lines.append(f"{indent}else:")
                lines.append(render(statement.orelse, indent + "    "))
        elif statement.kind == "try":
            lines.append(f"{indent}try:")
            lines.append(render(statement.body, indent + "    "))
            lines.append(f"{indent}except ValueError:")
            lines.append(render(statement.orelse, indent + "    "))
        elif statement.kind == "match":
            lines.append(f"{indent}match flag:")
            lines.append(f"{indent}    case 1:")
            lines.append(render(statement.body, indent + "        "))
            lines.append(f"{indent}    case _:")
            lines.append(render(statement.orelse, indent + "        "))
        else:
            lines.append(f"{indent}for item in others:")
            lines.append(render(statement.body, indent + "    "))
    return "\n".join(lines)


# An outcome of running a block: (passes so far, capped at 2; whether `xs` is still the
# parameter; how the block ended: "next", "return", "break" or "continue").
Outcome = tuple[int, bool, str]


def run(block: tuple[Stmt, ...], start: frozenset[tuple[int, bool]]) -> set[Outcome]:
    """Every way `block` can end from each of the `start` states (the model)."""
    done: set[Outcome] = set()
    current = set(start)
    for statement in block:
        following: set[tuple[int, bool]] = set()
        for outcome in run_one(statement, frozenset(current)):
            count, live, how = outcome
            if how == "next":
                following.add((count, live))
            else:
                done.add(outcome)
        current = following
    done.update((count, live, "next") for count, live in current)
    return done


def _use(count: int, live: bool) -> int:
    return min(2, count + 1) if live else count


def run_one(statement: Stmt, start: frozenset[tuple[int, bool]]) -> set[Outcome]:
    kind = statement.kind
    if kind in ("use", "use_either"):
        return {(_use(count, live), live, "next") for count, live in start}
    if kind == "return_use":
        return {(_use(count, live), live, "return") for count, live in start}
    if kind in ("return", "raise", "break", "continue"):
        return {(count, live, "return" if kind == "raise" else kind) for count, live in start}
    if kind == "rebind":
        return {(count, False, "next") for count, _ in start}
    if kind == "other":
        return {(count, live, "next") for count, live in start}
    if kind in ("if", "try", "match"):
        # Arms exclude each other; an `except` handler starts from the state before `try`.
        return run(statement.body, start) | run(statement.orelse, start)
    # A loop: its body runs any number of times; `break` leaves it, `continue` goes round.
    outcomes: set[Outcome] = set()
    seen: set[tuple[int, bool]] = set(start)
    frontier = set(start)
    while frontier:
        outcomes.update((count, live, "next") for count, live in frontier)
        following: set[tuple[int, bool]] = set()
        for count, live, how in run(statement.body, frozenset(frontier)):
            if how in ("next", "continue"):
                following.add((count, live))
            elif how == "break":
                outcomes.add((count, live, "next"))
            else:
                outcomes.add((count, live, how))
        frontier = following - seen
        seen |= following
    return outcomes


def model_reports(block: tuple[Stmt, ...]) -> bool:
    return any(count >= 2 for count, _, _ in run(block, frozenset({(0, True)})))


def analysis_reports(block: tuple[Stmt, ...]) -> MultiPass | None:
    source = (
        "from collections.abc import Iterable\n\n\n"
        "def f(xs: Iterable[int], flag: int, others: list[int]) -> int:\n"
        "    total = 0\n" + render(block) + "\n    return total\n"
    )
    summary = summarize("m.py", source.encode())
    facts = [fact for function in summary.functions for fact in function.multi_pass]
    return facts[0] if facts else None


@settings(max_examples=300, deadline=None)
@given(statements(in_loop=False))
def test_reported_exactly_when_some_path_consumes_twice(block: tuple[Stmt, ...]) -> None:
    fact = analysis_reports(block)
    assert (fact is not None) == model_reports(block), render(block)
    if fact is not None:
        # Two passes on one line only come from a loop here (the body has one pass per line).
        assert fact.first_line != fact.second_line or fact.loop_line, render(block)


@settings(max_examples=150, deadline=None)
@given(statements(in_loop=False), statements(in_loop=False))
def test_exclusive_arms_never_add_up(first: tuple[Stmt, ...], second: tuple[Stmt, ...]) -> None:
    # Each block alone consumes at most once on every path: in the two arms of an `if`, or
    # as a `return` branch before the other, together they still do.
    if analysis_reports(first) is not None or analysis_reports(second) is not None:
        return
    assert analysis_reports((Stmt("if", first, second),)) is None
    assert analysis_reports((Stmt("if", (*first, Stmt("return")), ()), *second)) is None
