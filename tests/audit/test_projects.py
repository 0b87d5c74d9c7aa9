"""Multi-file fixture projects: the cross-file cases, markers as in the single-file fixtures.

Each directory under `fixtures/projects/` is one project (its own root). Every `# KVRnnn`
marker must be found and nothing else; the unresolved bases are named and counted.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvref.audit.runner.scale
from kvref.audit import analyze
from kvref.audit.model import FileError
from kvref.audit.pipeline import SearchRoots
from kvref.audit.runner.cache import SummaryCache
from kvref.audit.runner.scale import run_pipeline
from kvref.audit.summarise.records import ModuleSummary

PROJECTS = Path(__file__).parent / "fixtures" / "projects"
_MARKER = re.compile(r"#\s*((?:KVR\d{3}\s*)+)$")

# Project name -> (its root inside the directory, extra search roots, expected unresolved).
CASES: dict[str, tuple[str, tuple[str, ...], dict[str, int]]] = {
    "reexport": (".", (), {}),
    "diamond": (".", (), {"shapes.bottom.Inconsistent (inconsistent MRO)": 1}),
    "generic": (".", (), {}),
    "stdlib": (".", (), {}),
    "thirdparty": (
        ".",
        (),
        {"torch.nn.Module": 3, "torch.nn.Linear": 1, "not_installed.make_base()": 1},
    ),
    "conditional": (".", (), {}),
    "srclayout": (".", (), {}),
    "namespace": (".", (), {}),
    "installed": ("project", ("site",), {}),
}


def markers(root: Path) -> list[tuple[str, int, str]]:
    expected: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = _MARKER.search(line)
            if match:
                expected.extend((relative, number, code) for code in match.group(1).split())
    return sorted(expected)


def test_every_project_directory_has_a_case() -> None:
    assert sorted(p.name for p in PROJECTS.iterdir() if p.is_dir()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_project_findings_match_markers(name: str) -> None:
    root_name, search, unresolved = CASES[name]
    root = PROJECTS / name / root_name
    files = sorted([*root.rglob("*.py"), *root.rglob("*.pyi")])
    result = analyze(files, root=root, search_paths=[PROJECTS / name / s for s in search])
    assert result.errors == []
    assert sorted((f.path, f.line, f.code) for f in result.findings) == markers(root)
    assert dict(result.unresolved_bases) == unresolved


def test_installed_bases_are_unresolved_without_search_paths() -> None:
    root = PROJECTS / "installed" / "project"
    result = analyze(sorted(root.rglob("*.py")), root=root)
    assert result.findings == []
    assert dict(result.unresolved_bases) == {"stubbed.Gadget": 1, "vendored.Widget": 1}


def test_only_report_files_are_reported_but_all_are_indexed() -> None:
    root = PROJECTS / "reexport"
    files = sorted(root.rglob("*.py"))
    relative = root / "pkg" / "sub" / "relative.py"
    result = analyze(files, root=root, report_files=[relative])
    assert {f.path for f in result.findings} == {"pkg/sub/relative.py"}
    assert len(result.findings) == 2
    assert result.files_analyzed == len(files)


def test_scripts_import_their_siblings_when_audited_from_an_outer_root() -> None:
    # generic/ has no __init__.py: `from bases import Store` is a sibling import, as when
    # running `python generic/impl.py`, even though the root is two levels up.
    project = PROJECTS / "generic"
    result = analyze(sorted(project.rglob("*.py")), root=PROJECTS.parent)
    assert result.unresolved_bases == {}
    found = sorted((f.path, f.line, f.code) for f in result.findings)
    assert found == [(f"projects/generic/{p}", n, c) for p, n, c in markers(project)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_file_reported_alone_gets_the_findings_of_the_whole_run(name: str) -> None:
    # Only reported files are summarised up front; every other file is read when a lookup
    # reaches it. Reporting one file at a time must change nothing about its findings.
    root_name, search, _ = CASES[name]
    root = PROJECTS / name / root_name
    files = sorted([*root.rglob("*.py"), *root.rglob("*.pyi")])
    search_paths = [PROJECTS / name / s for s in search]
    whole = analyze(files, root=root, search_paths=search_paths).findings
    for path in files:
        relative = path.relative_to(root).as_posix()
        alone = analyze(files, root=root, report_files=[path], search_paths=search_paths)
        assert alone.findings == [f for f in whole if f.path == relative], relative


@pytest.mark.parametrize("name", sorted(CASES))
def test_checking_in_forked_shares_from_pickled_summaries_changes_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The runner's path: summaries come from the cache still pickled, are unpickled where
    # they are checked, and the reported modules are split over forked processes (one module
    # per share here).
    monkeypatch.setattr(kvref.audit.runner.scale, "MIN_SHARE", 1)
    root_name, search, _ = CASES[name]
    root = PROJECTS / name / root_name
    files = sorted([*root.rglob("*.py"), *root.rglob("*.pyi")])
    roots = SearchRoots(search_paths=[PROJECTS / name / s for s in search])

    serial = analyze(files, root=root, search_paths=roots.search_paths)
    for run in ("cold", "warm"):
        cache = SummaryCache[ModuleSummary | FileError](tmp_path, "test")
        cache.load()
        forked = run_pipeline(files, root=root, roots=roots, jobs=4, cache=cache)
        cache.save()
        assert forked == serial, run
