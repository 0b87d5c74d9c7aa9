"""The reference stays about as short as the vLLM code it explains (`tools/reference_size.py`)."""

from __future__ import annotations

import pytest

from tools._audit_corpus import fetch_corpus
from tools.reference_size import MAX_RATIO, code_lines, main, sizes
from tools.vllm_env import VLLM_SPEC


def test_code_lines_leave_out_blanks_comments_and_docstrings() -> None:
    source = '"""Module."""\n\n\ndef f(x):  # why\n    """Doc\n    string."""\n    # a comment\n    return (x +\n            1)\n'
    assert code_lines(source) == 3  # def, return, and its continuation


def test_manager_and_policies_within_the_ratio_of_vllm_0_33(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0, capsys.readouterr().out
    rows = sizes(fetch_corpus(VLLM_SPEC, log=False).root)
    assert len(rows) == 5 and all(theirs > 0 and ours > 0 for _, theirs, ours in rows)
    assert sum(row[2] for row in rows) <= MAX_RATIO * sum(row[1] for row in rows)
