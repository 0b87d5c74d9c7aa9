"""`tools/simulate_policies.py`: hit-rate curves of LRU and ARC, as a table and a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.simulate_policies import TraceShape, ceiling, generate_trace, main, read_trace, simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_tiny_generated_trace_prints_the_table_and_writes_the_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rates.png"
    assert main(["--requests", "60", "--prefixes", "4", "--sizes", "16,64", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| cache blocks | LRU hit rate | ARC hit rate |" in lines
    rows = [line for line in lines if line.startswith("| 16 |") or line.startswith("| 64 |")]
    assert len(rows) == 2 and all(line.count("%") == 2 for line in rows)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_trace_file_is_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three requests share the prefix a, b; with room for everything the third hits a, b.
    trace = tmp_path / "trace.jsonl"
    lines = [{"blocks": ["a", "b", "c"]}, {"blocks": ["x"]}, {"blocks": ["a", "b", "d"]}]
    trace.write_text("# a comment\n" + "\n".join(json.dumps(line) for line in lines) + "\n\n")
    out = tmp_path / "file.png"
    assert main(["--trace", str(trace), "--sizes", "8", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # 2 of the 7 requested blocks hit, for either policy.
    assert "| 8 | 28.6% | 28.6% |" in text
    assert "unbounded cache: 28.6%" in text
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_hit_rates_grow_with_the_cache_and_stay_under_the_ceiling() -> None:
    requests = generate_trace(TraceShape(num_requests=300, num_prefixes=10, seed=3))
    rates = simulate(requests, [32, 256, 4096])
    limit = ceiling(requests)
    for values in rates.values():
        assert values == sorted(values)
        assert values[-1] <= limit + 1e-9
    # A cache that holds the whole trace reaches the ceiling, whatever the policy.
    assert rates["lru"][-1] == pytest.approx(limit) and rates["arc"][-1] == pytest.approx(limit)


def test_a_scan_hurts_lru_more_than_arc() -> None:
    requests = generate_trace(TraceShape(num_requests=600, num_prefixes=40, scan_share=0.3, seed=1))
    rates = simulate(requests, [256])
    assert rates["arc"][0] > rates["lru"][0]


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json\n", "1: not JSON"), ('{"blocks": [1, 2]}\n', '1: expected {"blocks"'), ("\n# only\n", "no requests")],
)
def test_bad_trace_files_are_refused_with_the_line(tmp_path: Path, content: str, message: str) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(content)
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("[", r"\[")):
        read_trace(trace)


def test_the_cli_exits_2_on_a_bad_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trace", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
