"""Path spelling shared by the engine, the pool and the cache driver."""

from __future__ import annotations

import os
from pathlib import Path

from kvref.audit.discover.paths import absolute_path, relative_path


def test_a_normalized_absolute_path_is_reused_and_others_are_normalized(tmp_path: Path) -> None:
    given = tmp_path / "pkg" / "mod.py"
    assert absolute_path(given) is given
    messy = Path(f"{tmp_path}/pkg/../pkg/./mod.py")
    assert absolute_path(messy) == given and absolute_path(messy) is not messy


def test_a_relative_path_is_made_absolute_from_the_working_directory(tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert absolute_path(Path("a.py")) == tmp_path / "a.py"
    finally:
        os.chdir(cwd)


def test_relative_paths_use_slashes_and_do_not_follow_links(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert relative_path(tmp_path / "link" / "m.py", tmp_path) == "link/m.py"
    assert relative_path(tmp_path / "a" / "b.py", tmp_path / "c") == "../a/b.py"
