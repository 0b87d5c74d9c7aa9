"""`kvref audit` end to end through both front ends (`main(argv)` and typer), on the fake engine.

Every exit code (0 clean / 1 findings / 2 error), every output format, fixing, diffs,
selection, explicit paths and errors. The real engine's end-to-end tests are in
`test_end_to_end.py`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Callable

import pytest

import kvref.cli
from kvref.audit.command import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from tests.audit.conftest import Outcome, Project

BASE = """\
class Base:
    def work(self):
        pass
"""

CHILD = """\
from pkg.base import Base


class Child(Base):
    def bad_work(self):
        pass

    def fine(self):
        pass
"""

FrontEnd = Callable[[Project, tuple[str, ...]], Outcome]


def _via_main(project: Project, argv: tuple[str, ...]) -> Outcome:
    return project.main(*argv)


def _via_typer(project: Project, argv: tuple[str, ...]) -> Outcome:
    return project.cli("audit", *argv)


def _via_console_script(project: Project, argv: tuple[str, ...]) -> Outcome:
    # `kvref audit ...` as installed: the fast parse when it accepts argv, typer otherwise.
    project.monkeypatch.chdir(project.root)
    project.monkeypatch.setattr(sys, "argv", ["kvref", "audit", *argv])
    project.capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        kvref.cli.main()
    captured = project.capsys.readouterr()
    code = exited.value.code
    return Outcome(code if isinstance(code, int) else EXIT_ERROR, captured.out, captured.err)


FRONT_ENDS = [
    pytest.param(_via_main, id="main"),
    pytest.param(_via_typer, id="typer"),
    pytest.param(_via_console_script, id="console-script"),
]


@pytest.fixture(params=FRONT_ENDS)
def run(request: pytest.FixtureRequest, project: Project) -> Callable[..., Outcome]:
    front_end: FrontEnd = request.param

    def invoke(*argv: str) -> Outcome:
        return front_end(project, argv)

    return invoke


def test_clean_project_exits_0(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"pkg/__init__.py": "", "pkg/base.py": BASE})
    outcome = run()
    assert outcome.code == EXIT_CLEAN
    assert outcome.stdout == ""
    assert "All checks passed." in outcome.stderr
    assert "Checked 2 files." in outcome.stderr


def test_findings_exit_1_with_path_line_col_code(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/child.py": CHILD})
    outcome = run()
    assert outcome.code == EXIT_FINDINGS
    assert outcome.stdout == (
        "pkg/child.py:5:9: KVR001 `bad_work` overrides a base method but has no @override\n"
    )
    assert "Found 1 finding (1 fixable with --fix)." in outcome.stderr


def test_exit_zero_keeps_the_report_but_exits_0(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"pkg/child.py": CHILD})
    outcome = run("--exit-zero")
    assert outcome.code == EXIT_CLEAN
    assert "KVR001" in outcome.stdout


def test_a_file_that_does_not_parse_is_an_error_and_the_rest_is_audited(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/broken.py": "def f(:\n    pass\n", "pkg/child.py": CHILD})
    outcome = run()
    assert outcome.code == EXIT_ERROR
    assert "pkg/child.py:5:9: KVR001" in outcome.stdout
    assert "pkg/broken.py:1:7: error: syntax error" in outcome.stderr
    assert "Traceback" not in outcome.stderr


def test_exit_zero_exits_0_with_unparsable_files_and_still_reports_them(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD, "pkg/broken.py": "def f(:\n    pass\n"})
    (project.root / "pkg" / "latin.py").write_bytes(b"x = '\xff'\n")
    outcome = run("--exit-zero")
    assert outcome.code == EXIT_CLEAN
    assert "pkg/child.py:5:9: KVR001" in outcome.stdout
    assert "pkg/latin.py:1:1: error: cannot decode" in outcome.stderr
    assert "pkg/broken.py:1:7: error: syntax error" in outcome.stderr
    # A usage error is not a report: it still exits 2.
    assert run("--exit-zero", "--select", "NOPE").code == EXIT_ERROR


def test_exit_zero_sarif_report_names_the_unparsable_file(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD, "pkg/broken.py": "def f(:\n    pass\n"})
    outcome = run("--exit-zero", "--output-format", "sarif")
    assert outcome.code == EXIT_CLEAN
    assert "pkg/broken.py" in outcome.stdout
    assert "KVR001" in outcome.stdout


def test_unknown_config_key_exits_2_naming_the_key_and_allowed_keys(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"a.py": BASE}, pyproject="[tool.kvref]\nselct = ['KVR0']\n")
    outcome = run()
    assert outcome.code == EXIT_ERROR
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1
    assert "unknown key 'selct'" in lines[0] and "extend-select" in lines[0]


def test_unknown_selector_exits_2(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"a.py": BASE})
    outcome = run("--select", "KVR9")
    assert outcome.code == EXIT_ERROR
    assert outcome.stderr.startswith("kvref: error: --select/--ignore/--extend-select/--extend-ignore: unknown rule selector 'KVR9'")


SELECTION_PROJECT = {
    "m.py": """\
    class C(Missing):
        def bad_a(self): pass
        def stale_b(self): pass
        def narrow_c(self, x: Sequence[int]): pass
        def twice_d(self): pass
        def drift_e(self): pass
    """
}


@pytest.mark.parametrize(
    ("argv", "codes"),
    [
        ((), ["KVR001", "KVR002", "KVR101", "KVR102"]),
        (("--select", "KVR0"), ["KVR001", "KVR002"]),
        (("--select", "KVR1"), ["KVR101", "KVR102"]),  # KVR103 is off: a prefix does not enable it
        (("--select", "KVR103"), ["KVR103"]),
        (("--select", "ALL"), ["KVR001", "KVR002", "KVR101", "KVR102", "KVR103"]),
        (("--select", "kvr001,KVR102"), ["KVR001", "KVR102"]),
        (("--select", "KVR001", "--select", "KVR002"), ["KVR001", "KVR002"]),
        (("--ignore", "KVR1"), ["KVR001", "KVR002"]),
        (("--select", "ALL", "--ignore", "KVR10", "--ignore", "KVR001"), ["KVR002"]),
        (("--select", "KVR1,KVR101", "--ignore", "KVR1"), ["KVR101"]),  # more specific wins
    ],
)
def test_select_and_ignore_accept_codes_and_prefixes(
    project: Project, run: Callable[..., Outcome], argv: tuple[str, ...], codes: list[str]
) -> None:
    project.write(SELECTION_PROJECT)
    outcome = run(*argv)
    assert [line.split()[1] for line in outcome.stdout.splitlines()] == codes


def test_config_selection_and_cli_layer(project: Project, run: Callable[..., Outcome]) -> None:
    project.write(
        SELECTION_PROJECT,
        pyproject='[tool.kvref]\nselect = ["KVR0"]\nextend-select = ["KVR103"]\nignore = ["KVR002"]\n',
    )
    assert [line.split()[1] for line in run().stdout.splitlines()] == ["KVR001", "KVR103"]
    # A --select on the command line replaces the configured selection.
    assert [line.split()[1] for line in run("--select", "KVR102").stdout.splitlines()] == ["KVR102"]
    assert [line.split()[1] for line in run("--ignore", "KVR001").stdout.splitlines()] == ["KVR103"]


def test_unresolved_bases_are_named_in_the_summary(project: Project, run: Callable[..., Outcome]) -> None:
    project.write(SELECTION_PROJECT)
    outcome = run()
    assert (
        "1 base class could not be resolved, so 1 class inheriting from them was only checked "
        "against their known bases: pkg.Missing (1)" in outcome.stderr
    )


def test_fix_applies_safe_fixes_and_exits_0_when_nothing_remains(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD})
    outcome = run("--fix")
    assert outcome.code == EXIT_CLEAN, outcome
    assert outcome.stdout == ""
    assert "Fixed 1 finding in 1 file." in outcome.stderr
    fixed = (project.root / "pkg/child.py").read_text()
    assert fixed.startswith("from typing_extensions import override\n")
    assert "    @override\n    def bad_work(self):" in fixed
    # Idempotent: a second run has nothing left to fix.
    again = run("--fix")
    assert again.code == EXIT_CLEAN
    assert (project.root / "pkg/child.py").read_text() == fixed


def test_the_engine_gets_the_configured_override_import_and_the_project_facts(
    project: Project, run: Callable[..., Outcome]
) -> None:
    pyproject = (
        'requires-python = ">=3.11"\ndependencies = ["Typing_Extensions>=4"]\n'
        '[tool.kvref]\noverride-import = "typing"\ntarget-version = "py312"\n'
    )
    project.write({"child.py": CHILD}, pyproject=pyproject)
    assert run().code == EXIT_FINDINGS
    options = project.engine.options[-1]
    assert (options.override_import, options.python_floor) == ("typing", (3, 12))
    assert options.typing_extensions == "runtime" and "child" in options.first_party


def test_override_import_typing_below_a_3_12_floor_is_a_config_error(
    project: Project, run: Callable[..., Outcome]
) -> None:
    pyproject = 'requires-python = ">=3.11"\n[tool.kvref]\noverride-import = "typing"\n'
    project.write({"child.py": CHILD}, pyproject=pyproject)
    outcome = run()
    assert outcome.code == EXIT_ERROR
    assert "override-import = 'typing' needs Python 3.12+, but the project's floor is 3.11" in outcome.stderr


def test_fix_keeps_file_mode_and_leaves_no_temporary_files(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD})
    target = project.root / "pkg/child.py"
    os.chmod(target, 0o640)
    assert run("--fix").code == EXIT_CLEAN
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["child.py"]


def test_unsafe_fixes_need_the_flag(project: Project, run: Callable[..., Outcome]) -> None:
    source = "def narrow_x(keys: Sequence[int]): pass\n"
    project.write({"m.py": source})
    outcome = run("--fix")
    assert outcome.code == EXIT_FINDINGS
    assert (project.root / "m.py").read_text() == source
    assert "(1 more with --unsafe-fixes)" in outcome.stderr
    assert "\n1 KVR101 fix needs --unsafe-fixes: the body may index it.\n" in outcome.stderr
    outcome = run("--fix", "--unsafe-fixes")
    assert outcome.code == EXIT_CLEAN
    assert (project.root / "m.py").read_text() == "def narrow_x(keys: Collection[int]): pass\n"


def test_unfixable_findings_remain_after_fix(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"m.py": "def bad_a(): pass\ndef twice_b(): pass\n"})
    outcome = run("--fix")
    assert outcome.code == EXIT_FINDINGS
    assert outcome.stdout.splitlines() == ["m.py:4:5: KVR102 `twice_b` iterates an Iterable twice"]
    assert "Fixed 1 finding in 1 file." in outcome.stderr


def test_a_fix_that_would_not_parse_is_not_written(project: Project, run: Callable[..., Outcome]) -> None:
    source = "def bad_broken(): pass\n"
    project.write({"m.py": source, "n.py": "def bad_ok(): pass\n"})
    outcome = run("--fix")
    assert outcome.code == EXIT_ERROR
    assert (project.root / "m.py").read_text() == source
    assert "m.py:1:5: error: fixes not applied (the result would not parse)" in outcome.stderr
    # The other file was still fixed.
    assert "@override" in (project.root / "n.py").read_text()


def test_diff_prints_unified_diffs_writes_nothing_and_exits_1(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"pkg/child.py": CHILD})
    before = (project.root / "pkg/child.py").read_bytes()
    outcome = run("--diff")
    assert outcome.code == EXIT_FINDINGS
    assert (project.root / "pkg/child.py").read_bytes() == before
    assert outcome.stdout.startswith("--- a/pkg/child.py\n+++ b/pkg/child.py\n")
    assert "+from typing_extensions import override\n" in outcome.stdout
    assert "+    @override\n" in outcome.stdout
    assert "Would fix 1 finding in 1 file." in outcome.stderr


def test_diff_exits_0_when_nothing_would_change(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"m.py": "def twice_a(): pass\n"})
    outcome = run("--diff")
    assert outcome.code == EXIT_CLEAN
    assert outcome.stdout == ""


def test_explicit_paths_index_the_whole_project_and_report_only_them(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write(
        {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/child.py": CHILD, "pkg/other.py": CHILD}
    )
    outcome = run("pkg/child.py")
    assert outcome.code == EXIT_FINDINGS
    assert [line.split(":")[0] for line in outcome.stdout.splitlines()] == ["pkg/child.py"]
    indexed, reported = project.engine.calls[-1]
    assert indexed == ["pkg/__init__.py", "pkg/base.py", "pkg/child.py", "pkg/other.py"]
    assert reported == ["pkg/child.py"]
    # --fix touches only the named file.
    assert run("--fix", "pkg/child.py").code == EXIT_CLEAN
    assert "@override" not in (project.root / "pkg/other.py").read_text()


def test_paths_from_a_subdirectory_are_reported_relative_to_the_project_root(
    project: Project,
) -> None:
    project.write({"pkg/child.py": CHILD})
    project.monkeypatch.chdir(project.root / "pkg")
    from kvref.cli import audit_main as main

    project.capsys.readouterr()
    assert main(["child.py"]) == EXIT_FINDINGS
    assert project.capsys.readouterr().out.startswith("pkg/child.py:5:9: KVR001")


def test_per_file_ignores(project: Project, run: Callable[..., Outcome]) -> None:
    project.write(
        {"src/m.py": CHILD, "tests/test_m.py": CHILD, "tests/deep/test_n.py": SELECTION_PROJECT["m.py"]},
        pyproject='[tool.kvref.per-file-ignores]\n"tests/**" = ["KVR0"]\n"test_n.py" = ["KVR102"]\n',
    )
    lines = run().stdout.splitlines()
    assert [(line.split(":")[0], line.split()[1]) for line in lines] == [
        ("src/m.py", "KVR001"),
        ("tests/deep/test_n.py", "KVR101"),
    ]


def test_missing_path_exits_2(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"a.py": BASE})
    outcome = run("nope.py")
    assert outcome.code == EXIT_ERROR
    assert outcome.stderr == "kvref: error: nope.py: no such file or directory\n"


def test_write_baseline_with_fix_is_a_usage_error(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"a.py": BASE})
    outcome = run("--fix", "--write-baseline", "b.json")
    assert outcome.code == EXIT_ERROR
    assert "cannot be combined" in outcome.stderr


def test_an_internal_error_exits_2_with_one_line_and_no_traceback(
    project: Project, run: Callable[..., Outcome]
) -> None:
    project.write({"a.py": BASE})

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("engine exploded")

    project.monkeypatch.setattr(project.engine, "analyze", explode)
    outcome = run()
    assert outcome.code == EXIT_ERROR
    assert outcome.stderr == "kvref: internal error: RuntimeError: engine exploded\n"


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_every_output_format_exits_by_the_same_rules(
    project: Project, run: Callable[..., Outcome], fmt: str
) -> None:
    project.write({"pkg/child.py": CHILD})
    outcome = run("--output-format", fmt)
    assert outcome.code == EXIT_FINDINGS
    assert "bad_work" in outcome.stdout
    if fmt in ("json", "sarif"):
        json.loads(outcome.stdout)
    (project.root / "pkg/child.py").write_text(BASE)
    clean = run("--output-format", fmt)
    assert clean.code == EXIT_CLEAN


def test_bad_output_format_is_a_usage_error(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"a.py": BASE})
    assert run("--output-format", "xml").code == EXIT_ERROR


def test_main_help_exits_0(project: Project) -> None:
    outcome = project.main("--help")
    assert outcome.code == EXIT_CLEAN
    assert "--write-baseline" in outcome.stdout


def test_rules_lists_every_rule(project: Project) -> None:
    outcome = project.cli("rules")
    assert outcome.code == EXIT_CLEAN
    lines = outcome.stdout.splitlines()
    assert lines[0].split() == ["code", "name", "default", "fix", "summary"]
    assert lines[1].split()[:4] == ["KVR001", "missing-override", "on", "safe"]
    assert lines[3].split()[:4] == ["KVR101", "narrowed-collection-parameter", "on", "unsafe"]
    assert lines[4].split()[:4] == ["KVR102", "multi-pass-iterable", "on", "none"]
    assert lines[5].split()[:4] == ["KVR103", "override-annotation-drift", "off", "unsafe"]
    assert lines[4].endswith("Checks double iteration.")


def test_explain_prints_the_rule_documentation(project: Project) -> None:
    outcome = project.cli("explain", "kvr001")
    assert outcome.code == EXIT_CLEAN
    assert outcome.stdout.startswith("KVR001 missing-override (on by default; safe fix)\n")
    assert "## Why is this bad?" in outcome.stdout
    assert project.cli("explain", "stale-override").stdout.startswith("KVR002 stale-override")
    unknown = project.cli("explain", "KVR999")
    assert unknown.code == EXIT_ERROR
    assert unknown.stderr.startswith("kvref: error: unknown rule 'KVR999'")


def test_text_colour_follows_force_color_and_no_color(project: Project) -> None:
    project.write({"pkg/child.py": CHILD})
    coloured = project.cli("audit", env={"FORCE_COLOR": "1"})
    assert "\x1b[" in coloured.stdout
    plain = project.cli("audit", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\x1b[" not in plain.stdout
    as_json = project.cli("audit", "--output-format", "json", env={"FORCE_COLOR": "1"})
    assert "\x1b[" not in as_json.stdout


def test_no_paths_from_a_subdirectory_reports_on_that_directory(project: Project) -> None:
    project.write({"pkg/child.py": CHILD, "other/child.py": CHILD})
    project.monkeypatch.chdir(project.root / "pkg")
    from kvref.cli import audit_main as main

    project.capsys.readouterr()
    assert main([]) == EXIT_FINDINGS
    assert [line.split(":")[0] for line in project.capsys.readouterr().out.splitlines()] == ["pkg/child.py"]
    indexed, reported = project.engine.calls[-1]
    assert indexed == ["other/child.py", "pkg/child.py"]
    assert reported == ["pkg/child.py"]


def test_config_option_reads_another_file(project: Project, run: Callable[..., Outcome]) -> None:
    project.write(SELECTION_PROJECT)
    (project.root / "kvref.toml").write_text('select = ["KVR102"]\n')
    outcome = run("--config", "kvref.toml")
    assert [line.split()[1] for line in outcome.stdout.splitlines()] == ["KVR102"]
    missing = run("--config", "nope.toml")
    assert missing.code == EXIT_ERROR
    assert missing.stderr == "kvref: error: --config nope.toml: no such file\n"


def test_config_outside_the_tree_applies_to_the_tree(
    project: Project, run: Callable[..., Outcome], tmp_path_factory: pytest.TempPathFactory
) -> None:
    project.write(SELECTION_PROJECT)
    elsewhere = tmp_path_factory.mktemp("shared-config")
    (elsewhere / "pyproject.toml").write_text('[tool.kvref]\nselect = ["KVR102"]\n')
    outcome = run("--config", str(elsewhere / "pyproject.toml"))
    assert [line.split()[1] for line in outcome.stdout.splitlines()] == ["KVR102"]
    assert "Checked 0 files" not in outcome.stderr
    assert outcome.code == EXIT_FINDINGS


def test_config_baseline_is_relative_to_the_config_file(
    project: Project, run: Callable[..., Outcome], tmp_path_factory: pytest.TempPathFactory
) -> None:
    project.write({"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/child.py": CHILD})
    elsewhere = tmp_path_factory.mktemp("shared-config")
    (elsewhere / "kvref.toml").write_text('baseline = "recorded.json"\n')
    assert run("--write-baseline", str(elsewhere / "recorded.json")).code == EXIT_CLEAN
    outcome = run("--config", str(elsewhere / "kvref.toml"))
    assert outcome.code == EXIT_CLEAN
    assert outcome.stdout == ""


def test_only_excluded_files_named_means_nothing_to_do(project: Project, run: Callable[..., Outcome]) -> None:
    project.write({"gen/m.py": CHILD, "a.py": BASE}, pyproject='[tool.kvref]\nextend-exclude = ["gen"]\nforce-exclude = true\n')
    outcome = run("gen/m.py")
    assert outcome.code == EXIT_CLEAN
    assert outcome.stdout == ""
    assert "Checked 0 files" in outcome.stderr
    assert project.engine.calls == []


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("--jobs", "0"),
        ("--output-format", "yaml"),
        ("--no-such-option",),
        ("--exit",),  # click takes no abbreviation of --exit-zero: neither may the fast path
    ],
)
def test_the_console_script_leaves_help_and_usage_errors_to_typer(
    project: Project, argv: tuple[str, ...]
) -> None:
    project.write({"pkg/__init__.py": "", "pkg/base.py": BASE})
    typer_outcome = _via_typer(project, argv)
    script = _via_console_script(project, argv)
    # click names the program after sys.argv[0] and `python -m`; CliRunner calls it kvref.
    prog = re.compile(r"python -m [\w.]*kvref")
    # (Help text wraps at the terminal's width, which CliRunner fixes: compare its first line.)
    first_line = prog.sub("kvref", script.stdout).partition("\n")[0]
    assert (script.code, first_line) == (typer_outcome.code, typer_outcome.stdout.partition("\n")[0])
    if typer_outcome.stderr:
        # The same error as click's usage block, as one line.
        error = typer_outcome.stderr.rpartition("Error: ")[2].strip()
        assert script.stderr.count("\n") == 1 and error in script.stderr, script.stderr
    else:
        assert script.stderr == ""
    assert typer_outcome.code in (EXIT_CLEAN, EXIT_ERROR)
    assert not project.engine.calls  # nothing was audited


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("audit", "--jobs", "0"), "kvref audit: error: Invalid value for '--jobs'"),
        (("audit", "--no-such-option"), "kvref audit: error: No such option: --no-such-option"),
        (("demo", "--no-such-option"), "kvref demo: error: No such option: --no-such-option"),
        (("no-such-command",), "kvref: error: No such command 'no-such-command'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    project: Project, argv: tuple[str, ...], message: str
) -> None:
    project.monkeypatch.setattr(sys, "argv", ["kvref", *argv])
    project.capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        kvref.cli.main()
    captured = project.capsys.readouterr()
    assert exited.value.code == EXIT_ERROR
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(message), captured.err


def test_bare_kvref_prints_the_help_and_exits_2(project: Project) -> None:
    project.monkeypatch.setattr(sys, "argv", ["kvref"])
    with pytest.raises(SystemExit) as exited:
        kvref.cli.main()
    assert exited.value.code == EXIT_ERROR
    assert "Commands" in project.capsys.readouterr().out
