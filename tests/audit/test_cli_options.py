"""The ruff-style options of `kvref audit` through every front end, on the fake engine:
--extend-select/--extend-ignore, --statistics, -q/--quiet, --show-fixes, and the one-line
exit-2 errors of options that cannot go together. (Stdin, which needs the real engine's
overlay, is tested in `test_stdin.py`.)"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from kvref.audit.command import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from tests.audit.conftest import Outcome, Project
from tests.audit.test_cli import CHILD, FRONT_ENDS, SELECTION_PROJECT


@pytest.fixture(params=FRONT_ENDS)
def run(request: pytest.FixtureRequest, project: Project) -> Callable[..., Outcome]:
    front_end: Callable[[Project, tuple[str, ...]], Outcome] = request.param

    def invoke(*argv: str) -> Outcome:
        return front_end(project, argv)

    return invoke


def _codes(outcome: Outcome) -> list[str]:
    return [line.split()[1] for line in outcome.stdout.splitlines()]


@pytest.mark.parametrize(
    ("argv", "codes"),
    [
        # Added on top of the default selection; an off-by-default rule needs its code.
        (("--extend-select", "KVR103"), ["KVR001", "KVR002", "KVR101", "KVR102", "KVR103"]),
        (("--extend-select", "KVR1"), ["KVR001", "KVR002", "KVR101", "KVR102"]),
        (("--select", "KVR0", "--extend-select", "KVR102"), ["KVR001", "KVR002", "KVR102"]),
        # The more specific selector wins, whichever option it came from.
        (("--ignore", "KVR1", "--extend-select", "KVR102"), ["KVR001", "KVR002", "KVR102"]),
        (("--extend-select", "KVR1,KVR103", "--ignore", "KVR10"), ["KVR001", "KVR002", "KVR103"]),
        (("--extend-ignore", "KVR0"), ["KVR101", "KVR102"]),
        (("--select", "KVR0,KVR101", "--extend-ignore", "KVR001"), ["KVR002", "KVR101"]),
        (("--ignore", "KVR001", "--extend-ignore", "KVR002"), ["KVR101", "KVR102"]),
    ],
)
def test_extend_select_and_extend_ignore_follow_ruff(
    project: Project, run: Callable[..., Outcome], argv: tuple[str, ...], codes: list[str]
) -> None:
    project.write(SELECTION_PROJECT)
    assert _codes(run(*argv)) == codes


def test_extend_select_adds_to_the_configured_selection(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write(SELECTION_PROJECT, pyproject='[tool.kvref]\nselect = ["KVR0"]\n')
    assert _codes(run("--extend-select", "KVR102")) == ["KVR001", "KVR002", "KVR102"]


def test_an_unknown_extend_selector_exits_2_with_one_line(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write(SELECTION_PROJECT)
    outcome = run("--extend-select", "KVR9")
    assert outcome.code == EXIT_ERROR
    assert outcome.stderr.count("\n") == 1
    assert "unknown rule selector 'KVR9'" in outcome.stderr


STATS_PROJECT = {
    "m.py": """\
    class C(Missing):
        def bad_a(self): pass
        def bad_b(self): pass
        def twice_c(self): pass
        def narrow_d(self, x: Sequence[int]): pass
    """
}


def test_statistics_prints_one_line_per_code_with_its_count(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write(STATS_PROJECT)
    outcome = run("--statistics")
    assert outcome.code == EXIT_FINDINGS
    # Most frequent first; `[*]`: --fix fixes some of them (KVR101's fix needs --unsafe-fixes).
    assert outcome.stdout == (
        "    2\tKVR001\t[*] missing-override\n"
        "    1\tKVR101\tnarrowed-collection-parameter\n"
        "    1\tKVR102\tmulti-pass-iterable\n"
    )
    assert "Found 4 findings" in outcome.stderr


def test_statistics_as_json(project: Project, run: Callable[..., Outcome]) -> None:
    project.write(STATS_PROJECT)
    outcome = run("--statistics", "--output-format", "json", "--unsafe-fixes")
    assert json.loads(outcome.stdout) == [
        {"code": "KVR001", "name": "missing-override", "count": 2, "fixable": 2},
        {"code": "KVR101", "name": "narrowed-collection-parameter", "count": 1, "fixable": 1},
        {"code": "KVR102", "name": "multi-pass-iterable", "count": 1, "fixable": 0},
    ]


def test_statistics_of_a_clean_project_is_empty(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"a.py": "class A:\n    pass\n"})
    outcome = run("--statistics")
    assert (outcome.code, outcome.stdout) == (EXIT_CLEAN, "")


def test_statistics_with_sarif_is_a_one_line_usage_error(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write(STATS_PROJECT)
    outcome = run("--statistics", "--output-format", "sarif")
    assert outcome.code == EXIT_ERROR
    assert outcome.stdout == ""
    assert outcome.stderr == "kvref: error: --statistics prints text or json, not sarif\n"


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_quiet_prints_the_findings_and_no_summary(
    project: Project, run: Callable[..., Outcome], flag: str
) -> None:
    project.write(STATS_PROJECT)
    loud = run()
    quiet = run(flag)
    assert quiet.code == loud.code == EXIT_FINDINGS
    assert quiet.stdout == loud.stdout != ""
    assert "Found 4 findings" in loud.stderr
    assert quiet.stderr == ""


def test_quiet_still_names_files_that_do_not_parse(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"broken.py": "def (:\n"})
    outcome = run("-q")
    assert outcome.code == EXIT_ERROR
    assert outcome.stderr.startswith("broken.py:1:")
    assert "Checked" not in outcome.stderr


def test_show_fixes_lists_what_fix_would_fix_and_writes_nothing(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD})
    before = (project.root / "pkg/child.py").read_text()
    outcome = run("--show-fixes")
    assert outcome.code == EXIT_FINDINGS
    assert "Would fix 1 finding:\n- pkg/child.py:\n    1 x KVR001 (missing-override)\n" in outcome.stderr
    assert (project.root / "pkg/child.py").read_text() == before


def test_show_fixes_with_fix_lists_what_was_fixed(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"pkg/child.py": CHILD})
    outcome = run("--fix", "--show-fixes")
    assert outcome.code == EXIT_CLEAN
    assert "Fixed 1 finding:\n- pkg/child.py:\n    1 x KVR001 (missing-override)\n" in outcome.stderr
    assert "@override" in (project.root / "pkg/child.py").read_text()
    # Nothing left: the listing says so.
    assert "No fixes applied." in run("--fix", "--show-fixes").stderr


def test_show_fixes_without_fixable_findings(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"m.py": "class C(Missing):\n    def twice_a(self): pass\n"})
    assert "No fixes available." in run("--show-fixes").stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--stdin-filename", "a.py"), "--stdin-filename needs `-` as the path to audit"),
        (("-",), "`-` (stdin) needs --stdin-filename PATH and no other path"),
        (("-", "a.py", "--stdin-filename", "a.py"), "`-` (stdin) needs --stdin-filename PATH and no other path"),
        (
            ("-", "--stdin-filename", "a.py", "--write-baseline", "b.json"),
            "--write-baseline cannot be combined with stdin (`-`)",
        ),
    ],
)
def test_stdin_misuse_is_one_line_and_exit_2(
    project: Project, run: Callable[..., Outcome], argv: tuple[str, ...], message: str
) -> None:
    project.write({"a.py": "class A:\n    pass\n"})
    outcome = run(*argv)
    assert (outcome.code, outcome.stdout, outcome.stderr) == (EXIT_ERROR, "", f"kvref: error: {message}\n")
    assert not project.engine.calls


def test_the_readme_names_exactly_the_options_of_kvref_audit_help() -> None:
    import re
    from pathlib import Path

    import typer.main

    from kvref.cli import app

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## `kvref audit`", 1)[1].split("| code | name |", 1)[0]
    audit = getattr(typer.main.get_command(app), "commands")["audit"]
    options = {opt for param in audit.params for opt in param.opts if opt.startswith("-")}
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*[a-z]|-[a-z])\b", section))
    assert named - {"--help"} == options
    for param in audit.params:
        metavar = getattr(param, "metavar", None)
        if metavar and param.opts[0].startswith("--"):
            assert f"{param.opts[0]} {metavar}" in " ".join(section.split()), param.opts[0]


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("a.py", "pkg", "--select", "KVR0,KVR101", "--select", "KVR102", "--extend-ignore", "KVR002"),
        ("--output-format", "json", "--statistics", "-q", "--exit-zero", "--jobs", "3"),
        ("--fix", "--unsafe-fixes", "--show-fixes", "--baseline", "b.json", "--no-cache"),
        ("--diff", "--config", "c.toml", "--cache-dir", "cache", "--python", "py", "--", "-x.py"),
        ("-", "--stdin-filename", "pkg/m.py", "--extend-select=KVR103"),
    ],
)
def test_the_fast_parse_builds_the_request_typer_builds(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    import typer
    from typer.testing import CliRunner

    import kvref.audit.command
    from kvref.audit.request import AuditRequest
    from kvref.cli import app, fast_audit

    seen: list[AuditRequest] = []

    def record(request: AuditRequest, **_: object) -> int:
        seen.append(request)
        return 0

    monkeypatch.setattr(kvref.audit.command, "run_audit", record)
    assert CliRunner().invoke(app, ["audit", *argv]).exit_code == 0
    with pytest.raises(typer.Exit):
        fast_audit(argv)
    assert len(seen) == 2
    assert seen[0] == seen[1]


def test_show_fixes_alone_keeps_the_exit_code_of_a_plain_run(
    project: Project, run: Callable[..., Outcome]
) -> None:
    # The fake fixer refuses `bad_broken` (its fix would not parse): only --fix reports that.
    project.write({"m.py": "def bad_broken(): pass\n", "n.py": "def bad_ok(): pass\n"})
    plain, shown = run(), run("--show-fixes")
    assert plain.code == shown.code == EXIT_FINDINGS
    assert "Would fix 1 finding:\n- n.py:\n" in shown.stderr
