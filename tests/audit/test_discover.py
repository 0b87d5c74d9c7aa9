"""File discovery: git and fallback .gitignore semantics, excludes, explicit paths, odd trees."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.audit.discover import files as discover_module
from kvref.audit.discover.files import DiscoveryError, discover
from kvref.audit.discover.gitignore import (
    IgnoreMatcher,
    is_gitignored,
    matches_glob,
    parse_gitignore,
)

HAS_GIT = shutil.which("git") is not None


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")


def _rel(root: Path, paths: tuple[Path, ...] | None) -> list[str]:
    assert paths is not None
    return sorted(path.relative_to(root).as_posix() for path in paths)


def _git_init(root: Path) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("build", "build/x.py", True),
        ("build", "src/build/x.py", True),
        ("build", "builder/x.py", False),
        ("*_pb2.py", "a/b/m_pb2.py", True),
        ("tests/fixtures", "tests/fixtures/a/b.py", True),
        ("tests/fixtures", "src/tests/fixtures/b.py", False),
        ("src/**/gen_*.py", "src/a/b/gen_x.py", True),
        ("src/**/gen_*.py", "src/gen_x.py", True),
        ("tests/**", "tests/a/b.py", True),
        ("tests/**", "tests.py", False),
        ("/top.py", "top.py", True),
        ("m?.py", "m1.py", True),
        ("m[!0-9].py", "m1.py", False),
        ("m[!0-9].py", "ma.py", True),
    ],
)
def test_matches_glob(pattern: str, path: str, expected: bool) -> None:
    assert matches_glob(pattern, path) is expected


@pytest.mark.parametrize(
    ("gitignore", "path", "is_dir", "ignored"),
    [
        ("*.py\n!keep.py\n", "a/keep.py", False, False),
        ("*.py\n!keep.py\n", "a/drop.py", False, True),
        ("out/\n", "out", False, False),  # a file named out is not a directory
        ("out/\n", "a/out", True, True),
        ("/out\n", "a/out", True, False),  # anchored to the .gitignore's directory
        ("a/b\n", "a/b", True, True),
        ("a/b\n", "x/a/b", True, False),
        ("**/gen\n", "x/y/gen", True, True),
        ("a/**/z.py\n", "a/z.py", False, True),
        ("a/**/z.py\n", "a/b/c/z.py", False, True),
        ("# comment\n\n\\#hash.py\n", "#hash.py", False, True),
        ("spaced.py   \n", "spaced.py", False, True),
        ("*\n!/**\n", "x/y.py", False, False),  # a lone ** matches across directories
    ],
)
def test_gitignore_patterns(gitignore: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert is_gitignored(parse_gitignore(gitignore, ""), path, is_dir=is_dir) is ignored


TREES: list[tuple[dict[str, str], list[str]]] = [
    ({".gitignore": "gen/\n*_pb2.py\n"}, ["gen/a.py", "m_pb2.py", "src/m.py", "src/gen/b.py"]),
    ({".gitignore": "*.py\n!keep.py\n"}, ["keep.py", "drop.py", "d/keep.py"]),
    ({".gitignore": "/top.py\n", "sub/.gitignore": "local.py\n!/top.py\n"}, ["top.py", "sub/top.py", "sub/local.py", "local.py"]),
    ({".gitignore": "data/**\n!data/keep/\n"}, ["data/x.py", "data/keep/y.py", "other.py"]),
    ({".gitignore": "a/**/z.py\nsub/\n"}, ["a/z.py", "a/b/z.py", "a/y.py", "sub/q.py", "x/sub/q.py"]),
]


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
@pytest.mark.parametrize(("ignores", "files"), TREES)
def test_the_fallback_walker_agrees_with_git(tmp_path: Path, ignores: dict[str, str], files: list[str]) -> None:
    for base in ("plain", "repo"):
        root = tmp_path / base
        _touch(root, *files)
        for rel, text in ignores.items():
            (root / rel).write_text(text)
    _git_init(tmp_path / "repo")
    walked = discover(tmp_path / "plain")
    from_git = discover(tmp_path / "repo")
    assert walked.vcs_root is None and from_git.vcs_root is not None
    assert _rel(tmp_path / "plain", walked.project_files) == _rel(tmp_path / "repo", from_git.project_files)


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_work_tree_uses_git_and_default_excludes(tmp_path: Path) -> None:
    _git_init(tmp_path)
    _touch(tmp_path, "pkg/a.py", "pkg/_ext.pyi", "ignored.py", ".venv/lib/x.py", "build/y.py", "pkg/__pycache__/z.py", "notes.txt")
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    (tmp_path / ".git" / "info" / "exclude").write_text("")
    found = discover(tmp_path)
    assert _rel(tmp_path, found.project_files) == ["pkg/_ext.pyi", "pkg/a.py"]  # stubs are indexed too
    assert found.report_files is None


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_info_exclude_is_honoured_outside_git_too(tmp_path: Path) -> None:
    _touch(tmp_path, "a.py", "a.pyi", "b.py", "b.pyi")
    (tmp_path / ".git" / "info").mkdir(parents=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("b.py*\n")
    # Not a repository (no HEAD), so the walker reads .git/info/exclude itself.
    found = discover(tmp_path)
    assert found.vcs_root is None
    assert _rel(tmp_path, found.project_files) == ["a.py", "a.pyi"]


def test_respect_gitignore_false_and_config_excludes(tmp_path: Path) -> None:
    _touch(tmp_path, "a.py", "ignored.py", "gen/g.py")
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    found = discover(tmp_path, excludes=("gen",), respect_gitignore=False)
    assert _rel(tmp_path, found.project_files) == ["a.py", "ignored.py"]


def test_explicit_files_are_always_audited_unless_force_exclude(tmp_path: Path) -> None:
    _touch(tmp_path, "a.py", "build/gen.py")
    found = discover(tmp_path, [tmp_path / "build/gen.py"])
    assert _rel(tmp_path, found.report_files) == ["build/gen.py"]
    assert "build/gen.py" in _rel(tmp_path, found.project_files)
    forced = discover(tmp_path, [tmp_path / "build/gen.py"], force_exclude=True)
    assert forced.report_files == ()


def test_a_directory_expands_to_the_project_files_below_it(tmp_path: Path) -> None:
    _touch(tmp_path, "pkg/a.py", "pkg/sub/b.py", "other/c.py", "pkg/build/d.py")
    found = discover(tmp_path, [Path("pkg")], cwd=tmp_path)
    assert _rel(tmp_path, found.report_files) == ["pkg/a.py", "pkg/sub/b.py"]
    assert _rel(tmp_path, found.project_files) == ["other/c.py", "pkg/a.py", "pkg/sub/b.py"]


def test_explicit_scripts_and_non_python_files(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("#!/usr/bin/env python3\nx = 1\n")
    (tmp_path / "README.md").write_text("# hi\n")
    found = discover(tmp_path, [tmp_path / "tool", tmp_path / "README.md"])
    assert _rel(tmp_path, found.report_files) == ["tool"]
    assert found.warnings == ("README.md: not a Python file, skipped",)


def test_missing_and_outside_paths_are_errors(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "elsewhere.py").write_text("")
    with pytest.raises(DiscoveryError, match="nope.py: no such file or directory"):
        discover(tmp_path / "proj", [Path("nope.py")], cwd=tmp_path / "proj")
    with pytest.raises(DiscoveryError, match="outside the project root"):
        discover(tmp_path / "proj", [tmp_path / "elsewhere.py"])


def test_symlink_loops_terminate_and_linked_directories_are_walked_once(tmp_path: Path) -> None:
    _touch(tmp_path, "pkg/a.py")
    os.symlink(tmp_path / "pkg", tmp_path / "pkg" / "loop")
    os.symlink(tmp_path / "missing", tmp_path / "dangling.py")
    found = discover(tmp_path)
    assert _rel(tmp_path, found.project_files) == ["pkg/a.py"]


def test_unreadable_directories_become_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path, "ok/a.py", "locked/b.py")
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str]) -> object:
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(discover_module.os, "scandir", scandir)
    found = discover(tmp_path)
    assert _rel(tmp_path, found.project_files) == ["ok/a.py"]
    assert found.warnings == ("cannot read directory locked: Permission denied",)


TREE = ["a.py", "ab.py", "b.py", "a/a.py", "a/b.py", "a/b/a.py", "a/b/c.py", "b/a/a.py", "c/ab/b.py"]
SEGMENTS = st.sampled_from(["a", "b", "ab", "*", "a*", "*.py", "?.py", "**", "[ab]", "[!a]*"])


@st.composite
def gitignore_lines(draw: st.DrawFn) -> str:
    segments = draw(st.lists(SEGMENTS, min_size=1, max_size=3))
    pattern = "/".join(segments)
    if draw(st.booleans()):
        pattern = "/" + pattern
    if draw(st.booleans()):
        pattern += "/"
    if draw(st.booleans()):
        pattern = "!" + pattern
    return pattern


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
@settings(max_examples=int(os.environ.get("KVREF_GITIGNORE_EXAMPLES", "25")))
@given(root_lines=st.lists(gitignore_lines(), max_size=4), nested_lines=st.lists(gitignore_lines(), max_size=2))
def test_the_fallback_walker_agrees_with_git_on_generated_patterns(
    root_lines: list[str], nested_lines: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        results: list[list[str]] = []
        for base in ("plain", "repo"):
            root = Path(scratch) / base
            _touch(root, *TREE)
            (root / ".gitignore").write_text("\n".join(root_lines) + "\n")
            (root / "a" / ".gitignore").write_text("\n".join(nested_lines) + "\n")
            if base == "repo":
                _git_init(root)
            results.append(_rel(root, discover(root).project_files))
        assert results[0] == results[1], (root_lines, nested_lines)


def test_a_directory_with_nothing_to_audit_says_so(tmp_path: Path) -> None:
    _touch(tmp_path, "a.py", "build/gen.py")
    found = discover(tmp_path, [tmp_path / "build"])
    assert found.report_files == ()
    assert found.warnings == ("build: no Python files to audit (excluded or ignored?)",)


PATHS = st.lists(st.sampled_from(["a", "b", "ab", "a.py", "b.py", "ab.py", "c"]), min_size=1, max_size=4)


@given(
    root_lines=st.lists(gitignore_lines(), max_size=5),
    nested_lines=st.lists(gitignore_lines(), max_size=3),
    parts=PATHS,
    is_dir=st.booleans(),
)
def test_the_walkers_matcher_agrees_with_the_rule_by_rule_reference(
    root_lines: list[str], nested_lines: list[str], parts: list[str], is_dir: bool
) -> None:
    # The walker joins each .gitignore into one regex (see IgnoreMatcher); `is_gitignored`
    # applies the rules one by one, last match winning: the two must always agree.
    root_rules = parse_gitignore("\n".join(root_lines), "")
    nested_rules = parse_gitignore("\n".join(nested_lines), "a")
    matcher = IgnoreMatcher().extended(root_rules).extended(nested_rules)
    rel_path = "/".join(parts)
    expected = is_gitignored([*root_rules, *nested_rules], rel_path, is_dir=is_dir)
    assert matcher.ignored(rel_path, is_dir=is_dir) == expected
