"""`kvref audit` end to end on the real engine: multi-file projects, fixing, formats, self-audit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvref.audit.rules import rule_catalogue
from kvref.audit.command import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from kvref.cli import audit_main as main
from kvref.audit.rules import ALL_RULES
from kvref.cli import app
from tests.audit.test_reports import validate_github_sarif

CHECKOUT = Path(__file__).resolve().parents[2]

BASE = '''\
"""Bases."""

from collections.abc import Collection, Iterable


class Tier:
    def lookup(self, keys: Collection[int]) -> int:
        return len(keys)

    def touch(self, keys: Collection[int]) -> None:
        pass

    def stream(self, items: Iterable[int]) -> int:
        return 0
'''

CHILD = '''\
"""A tier that drifted."""

from collections.abc import Iterable, Sequence

from pkg.base import Tier


class FsTier(Tier):
    def lookup(self, keys: Collection[int]) -> int:
        return 1

    def touch(self, keys: Sequence[int]) -> None:
        print(keys[0])

    def stream(self, items: Iterable[int]) -> int:
        total = sum(items)
        return total + len(list(items))
'''

OTHER = '''\
from pkg.base import Tier


class Other(Tier):
    def lookup(self, keys):
        return 2
'''


def _project(root: Path, extra: dict[str, str] | None = None, pyproject: str = "") -> Path:
    files = {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/child.py": CHILD, "pkg/other.py": OTHER}
    files.update(extra or {})
    # The project declares typing_extensions: the KVR001 fix may import it (safe).
    (root / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndependencies = ["typing_extensions>=4.12"]\n' + textwrap.dedent(pyproject)
    )
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return _project(tmp_path)


def _codes(stdout: str) -> list[tuple[str, str]]:
    return [(line.split(":")[0], line.split()[1]) for line in stdout.splitlines()]


def test_cross_file_findings(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys)
    assert code == EXIT_FINDINGS
    assert _codes(out) == [
        ("pkg/child.py", "KVR001"),
        ("pkg/child.py", "KVR001"),
        ("pkg/child.py", "KVR101"),
        ("pkg/child.py", "KVR001"),
        ("pkg/child.py", "KVR102"),
        ("pkg/other.py", "KVR001"),
    ]
    assert out.splitlines()[0].startswith("pkg/child.py:9:9: KVR001 ")
    assert "Checked 4 files." in err


def test_explicit_file_is_reported_alone_with_its_bases_indexed(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "pkg/other.py")
    assert code == EXIT_FINDINGS
    assert _codes(out) == [("pkg/other.py", "KVR001")]


def test_fix_then_unsafe_fix_then_clean(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--fix")
    assert code == EXIT_FINDINGS
    assert _codes(out) == [("pkg/child.py", "KVR101"), ("pkg/child.py", "KVR102")]
    assert "Fixed 4 findings in 2 files." in err
    child = (project / "pkg/child.py").read_text()
    assert child.count("    @override\n    def ") == 3
    assert "from typing_extensions import override" in child
    assert child.startswith('"""A tier that drifted."""\n')
    # Idempotent.
    assert _run(capsys, "--fix")[0] == EXIT_FINDINGS
    assert (project / "pkg/child.py").read_text() == child

    code, out, _ = _run(capsys, "--diff", "--unsafe-fixes")
    assert code == EXIT_FINDINGS
    assert "-    def touch(self, keys: Sequence[int]) -> None:" in out
    assert (project / "pkg/child.py").read_text() == child

    code, out, _ = _run(capsys, "--fix", "--unsafe-fixes", "--ignore", "KVR102")
    assert code == EXIT_CLEAN, out
    assert "def touch(self, keys: Collection[int]) -> None:" in (project / "pkg/child.py").read_text()


def test_fix_keeps_crlf_and_bom(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = b"\xef\xbb\xbffrom pkg.base import Tier\r\n\r\n\r\nclass C(Tier):\r\n    def lookup(self, keys):\r\n        return 0\r\n"
    (project / "pkg/crlf.py").write_bytes(source)
    assert _run(capsys, "--fix", "pkg/crlf.py")[0] == EXIT_CLEAN
    fixed = (project / "pkg/crlf.py").read_bytes()
    assert fixed.startswith(b"\xef\xbb\xbf")
    assert b"    @override\r\n    def lookup(self, keys):\r\n" in fixed
    assert b"\n" not in fixed.replace(b"\r\n", b"")


def test_a_broken_file_is_reported_and_the_rest_audited(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pkg/broken.py").write_text("class X(\n")
    code, out, err = _run(capsys)
    assert code == EXIT_ERROR
    assert ("pkg/other.py", "KVR001") in _codes(out)
    assert "pkg/broken.py:1:" in err and "error:" in err
    assert "Traceback" not in err


def test_selection_suppression_and_per_file_ignores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _project(
        tmp_path,
        {"pkg/other.py": OTHER.replace("def lookup(self, keys):", "def lookup(self, keys):  # noqa: KVR001")},
        pyproject='[tool.kvref]\nper-file-ignores = {"pkg/child.py" = ["KVR0"]}\n',
    )
    code, out, err = _run(capsys)
    assert _codes(out) == [("pkg/child.py", "KVR101"), ("pkg/child.py", "KVR102")]
    assert "1 finding suppressed by inline comments." in err
    assert code == EXIT_FINDINGS
    code, out, _ = _run(capsys, "--select", "KVR103")
    assert code == EXIT_CLEAN and out == ""


@pytest.mark.parametrize("fmt", ["json", "github", "sarif"])
def test_machine_formats_on_the_real_engine(project: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    code, out, _ = _run(capsys, "--output-format", fmt)
    assert code == EXIT_FINDINGS
    if fmt == "json":
        document = json.loads(out)
        assert [f["code"] for f in document["findings"]][:3] == ["KVR001", "KVR001", "KVR101"]
        first = document["findings"][0]
        assert first["symbol"] == "FsTier.lookup"
        assert first["fixable"] is True and first["fix"]["applicability"] == "safe"
        assert document["findings"][2]["fix"]["applicability"] == "unsafe"
    elif fmt == "github":
        assert out.splitlines()[0].startswith("::error file=pkg/child.py,line=9,col=9,endLine=9,")
    else:
        log = json.loads(out)
        validate_github_sarif(log)
        rules = log["runs"][0]["tool"]["driver"]["rules"]
        assert [rule["id"] for rule in rules] == [rule.code for rule in ALL_RULES]


def test_baseline_round_trip(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "--write-baseline", "baseline.json")[0] == EXIT_CLEAN
    code, out, err = _run(capsys, "--baseline", "baseline.json")
    assert (code, out) == (EXIT_CLEAN, "")
    assert "6 findings hidden by the baseline." in err
    (project / "pkg/new.py").write_text(OTHER.replace("Other", "New"))
    code, out, _ = _run(capsys, "--baseline", "baseline.json")
    assert code == EXIT_FINDINGS
    assert _codes(out) == [("pkg/new.py", "KVR001")]


def test_rules_and_explain_cover_every_registered_rule() -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["rules"])
    assert listed.exit_code == 0
    catalogue = rule_catalogue()
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [r.code for r in catalogue]
    for rule in catalogue:
        explained = runner.invoke(app, ["explain", rule.code])
        assert explained.exit_code == 0
        for heading in ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety"):
            assert heading in explained.stdout, (rule.code, heading)
        assert rule.summary and not rule.summary.startswith(("What", "#"))


def test_readme_rules_table_matches_the_registry() -> None:
    readme = (CHECKOUT / "README.md").read_text()
    section = readme[readme.index("## `kvref audit`") :]
    rows = [line.split("|")[1:5] for line in section.splitlines() if line.startswith("| KVR")]
    table = [tuple(cell.strip() for cell in row) for row in rows]
    assert table == [
        (rule.code, rule.name, "on" if rule.default_enabled else "off", rule.fix_safety)
        for rule in rule_catalogue()
    ]


def test_kvref_audits_itself_with_zero_findings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(CHECKOUT)
    code, out, err = _run(capsys, "kvref")
    assert (code, out) == (EXIT_CLEAN, ""), err
