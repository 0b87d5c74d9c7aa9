"""Bases from installed packages resolve the way pyright/mypy users expect.

Real virtual environments in a temporary directory: `--python` relative to the working
directory, `VIRTUAL_ENV`, a `.venv` in the project root, a real `pip install -e` of a
setuptools project (its import-hook finder), the `editables` redirector hatchling writes,
plain `.pth` path entries; and the summary's line about modules that are not installed.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvref.audit.discover.environment import discover_environment, find_interpreter
from kvref.audit.command import AuditRequest, OutputFormat, run_audit
from kvref.audit.report import Report, Summary
from kvref.audit.report.text import render_summary
from kvref.audit.runner.scale import ScaleSettings
from tests.audit.fakes import FAKE_RULES

ENGINE = "class Engine:\n    def step(self) -> None: ...\n"
PLUGIN = "from engine import Engine\n\n\nclass Plugin(Engine):\n    def step(self) -> None: ...\n"


def make_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return where


def site_packages(venv: Path) -> Path:
    [site] = (venv / "lib").glob("python3*/site-packages")
    return site


def make_project(root: Path) -> Path:
    (root / "plugin").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "plugin"\n')
    (root / "plugin" / "__init__.py").write_text("")
    (root / "plugin" / "impl.py").write_text(PLUGIN)
    return root


def audit(root: Path, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    python = Path(args[1]) if args[:1] == ("--python",) else None
    request = AuditRequest(
        paths=(),
        output_format=OutputFormat.TEXT,
        scale=ScaleSettings(cache=False, python=python, jobs=1),
    )
    code = run_audit(request, stdout=out, stderr=err, cwd=cwd or root)
    return code, out.getvalue(), err.getvalue()


def install_engine_editable(venv: Path, tmp_path: Path) -> Path:
    """`pip install -e` a flat-layout setuptools project: setuptools installs it with an
    import-hook finder (`__editable___engine_1_0_finder.py`), not a path entry."""
    source = tmp_path / "engine-src"
    (source / "engine").mkdir(parents=True)
    (source / "engine" / "__init__.py").write_text(ENGINE)
    (source / "docs").mkdir()
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "engine"
            version = "1.0"
            [tool.setuptools]
            packages = ["engine"]
            """
        )
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--disable-pip-version-check", "-e", str(source)],
        check=True,
        capture_output=True,
    )
    return source


@pytest.fixture(scope="module")
def engine_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (outside any project) with `engine` installed editable by a real pip."""
    base = tmp_path_factory.mktemp("engine")
    venv = make_venv(base / "venv")
    install_engine_editable(venv, base)
    return venv


def test_a_real_setuptools_editable_install_is_followed(engine_venv: Path) -> None:
    site = site_packages(engine_venv)
    assert any(site.glob("__editable___engine_1_0_finder.py"))  # the hook, not a path entry
    environment = discover_environment(engine_venv)
    [(name, where)] = [(n, w) for n, w in environment.package_roots if n == "engine"]
    assert (name, where.name) == ("engine", "engine")
    assert (where / "__init__.py").read_text() == ENGINE


def test_relative_python_resolves_bases_from_the_cwd(engine_venv: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    relative = os.path.relpath(engine_venv / "bin" / "python", project)
    code, out, err = audit(project, "--python", relative)
    assert code == 1, err
    assert "plugin/impl.py:5:9: KVR001" in out
    assert "not installed" not in err


def test_without_the_environment_the_summary_names_the_missing_module(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    bare = make_venv(tmp_path / "bare")
    code, out, err = audit(project, "--python", str(bare))
    assert code == 0 and out == ""
    assert (
        "1 module not installed where kvref looked: engine (1); pass --python with the "
        "project's interpreter or virtual environment" in err
    )


def test_a_dot_venv_in_the_project_root_is_found_and_kept(
    engine_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    project = make_project(tmp_path / "project")
    venv = make_venv(project / ".venv")
    # The engine as a plain path entry in the in-project venv's site-packages.
    engine_root = tmp_path / "engine-path"
    (engine_root / "engine").mkdir(parents=True)
    (engine_root / "engine" / "__init__.py").write_text(ENGINE)
    (site_packages(venv) / "engine.pth").write_text(f"{engine_root}\n")
    assert find_interpreter(None, cwd=project, project_root=project) == venv / "bin" / "python3"
    environment = discover_environment(venv, project_root=project)
    assert site_packages(venv) in environment.search_paths
    code, out, err = audit(project)
    assert code == 1, err
    assert "plugin/impl.py:5:9: KVR001" in out
    # The README's pre-commit configuration spells it out (pre-commit runs at the root).
    assert audit(project, "--python", ".venv/bin/python")[:2] == (code, out)


def test_virtual_env_comes_before_the_project_venv(
    engine_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_project(tmp_path / "project")
    make_venv(project / ".venv")  # without the engine
    monkeypatch.setenv("VIRTUAL_ENV", str(engine_venv))
    monkeypatch.delenv("PRE_COMMIT", raising=False)
    code, out, err = audit(project)
    assert code == 1, err
    assert "plugin/impl.py:5:9: KVR001" in out


def test_under_pre_commit_the_hooks_own_environment_gives_way_to_the_project_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_project(tmp_path / "project")
    venv = make_venv(project / ".venv")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # pre-commit activates the hook's env
    monkeypatch.setenv("PRE_COMMIT", "1")
    assert find_interpreter(None, cwd=project, project_root=project) == venv / "bin" / "python3"
    monkeypatch.delenv("PRE_COMMIT")
    assert find_interpreter(None, cwd=project, project_root=project) is None  # the running one


def test_explicit_python_wins_and_stale_environments_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "venv").mkdir(parents=True)  # no pyvenv.cfg: not a virtual environment
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "gone"))
    assert find_interpreter(None, cwd=project, project_root=project) is None
    assert find_interpreter(Path("x/python"), cwd=project, project_root=project) == project / "x" / "python"


def test_the_editables_redirector_and_setuptools_namespaces_are_read(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    hatch_pkg = tmp_path / "hatch-src" / "src" / "hatched"
    hatch_pkg.mkdir(parents=True)
    (hatch_pkg / "__init__.py").write_text(ENGINE)
    namespace = tmp_path / "ns-src" / "company"
    namespace.mkdir(parents=True)
    # What hatchling (dev-mode-exact) writes through the `editables` library.
    (site / "_hatched.pth").write_text("import _editable_impl_hatched\n")
    (site / "_editable_impl_hatched.py").write_text(
        "from editables.redirector import RedirectingFinder as F\nF.install()\n"
        f"F.map_module('hatched', {str(hatch_pkg / '__init__.py')!r})\n"
    )
    # What setuptools writes for a namespace package (no __init__.py) in flat layout.
    (site / "__editable__.company-1.0.pth").write_text(
        "import __editable___company_1_0_finder; __editable___company_1_0_finder.install()\n"
    )
    (site / "__editable___company_1_0_finder.py").write_text(
        "MAPPING: dict[str, str] = {}\n"
        f"NAMESPACES: dict[str, list[str]] = {{'company': [{str(namespace)!r}]}}\n"
    )
    environment = discover_environment(venv)
    assert dict(environment.package_roots) == {"hatched": hatch_pkg, "company": namespace}


def test_editable_roots_inside_the_project_are_the_projects_own(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    (site / "__editable__.plugin-1.0.pth").write_text("import __editable___plugin_finder\n")
    (site / "__editable___plugin_finder.py").write_text(
        f"MAPPING = {{'plugin': {str(project / 'plugin')!r}}}\n"
    )
    assert discover_environment(venv, project_root=project).package_roots == ()
    assert dict(discover_environment(venv).package_roots) == {"plugin": project / "plugin"}


def test_the_missing_modules_line_ranks_and_is_quiet_without_any() -> None:
    def summary_of(missing: dict[str, int]) -> str:
        summary = Summary(unresolved_bases={"torch.nn.Module": 9}, missing_modules=missing)
        return render_summary(Report([], [], FAKE_RULES, frozenset(), summary))

    assert "not installed" not in summary_of({})
    many = {f"m{index}": index for index in range(1, 8)}
    [line] = [line for line in summary_of(many).splitlines() if "not installed" in line]
    assert line.startswith(
        "7 modules not installed where kvref looked: m7 (7), m6 (6), m5 (5), m4 (4), m3 (3), "
        "and 2 more; pass --python"
    )


def make_python_dir_project(root: Path) -> Path:
    """Sources under `python/` (not `src/`), in a namespace package (no __init__.py)."""
    product = root / "python" / "company" / "product"
    product.mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "company-product"\n')
    (product / "base.py").write_text(ENGINE)
    (product / "impl.py").write_text(PLUGIN.replace("from engine", "from company.product.base"))
    return root


def test_a_project_directory_on_the_interpreters_path_is_an_import_root(tmp_path: Path) -> None:
    project = make_python_dir_project(tmp_path / "project")
    venv = make_venv(tmp_path / "venv")
    (site_packages(venv) / "company_product.pth").write_text(f"{project / 'python'}\n")
    environment = discover_environment(venv, project_root=project)
    assert environment.import_roots == (project / "python",)
    assert project / "python" not in environment.search_paths  # indexed as the project's
    code, out, err = audit(project, "--python", str(venv))
    assert code == 1, err
    assert "python/company/product/impl.py:5:9: KVR001" in out
    # Without it, `company` is nowhere to be found: the summary says so.
    bare = make_venv(tmp_path / "bare")
    code, out, err = audit(project, "--python", str(bare))
    assert (code, out) == (0, "")
    assert "1 module not installed where kvref looked: company (1)" in err


def test_an_editable_hook_mapping_into_the_project_names_an_import_root(tmp_path: Path) -> None:
    project = make_python_dir_project(tmp_path / "project")
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    (site / "__editable__.company_product-1.0.pth").write_text("import __editable___cp_finder\n")
    (site / "__editable___cp_finder.py").write_text(
        f"MAPPING = {{'company.product': {str(project / 'python' / 'company' / 'product')!r}}}\n"
    )
    environment = discover_environment(venv, project_root=project)
    assert (environment.package_roots, environment.import_roots) == ((), (project / "python",))
