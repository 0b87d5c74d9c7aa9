"""Auditing text that is not on disk: `kvref audit - --stdin-filename PATH` (editors).

The text is summarised as the module at PATH, every other project file as it is on disk, so
names resolve across the project as if the text had been saved there; nothing is cached (the
caches describe the files on disk) and nothing is written. The project is PATH's, found from
PATH as for a named file (`kvref.audit.run`), whatever the current directory. (`kvref server`
audits its editors' buffers the same way, through `kvref.audit.pipeline.analyze_project`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kvref.audit.discover.environment import discover_environment
from kvref.audit.discover.paths import absolute_path, relative_path
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError
from kvref.audit.source import summary_or_error
from kvref.audit.summarise.newer_syntax import use_interpreter
from kvref.audit.summarise.summary import ModuleSummary, summarize

__all__ = ["analyze_source"]


def analyze_source(
    project_files: Sequence[Path],
    *,
    root: Path,
    target: Path,
    source: bytes,
    options: AnalysisOptions,
    python: Path | None,
) -> AnalysisResult:
    """The findings for `source` audited as the file `target` of the project at `root`.

    Args:
        project_files: the project's files (`target` is added when missing).
        root: the project root.
        target: where the text would live (it need not exist).
        source: the text's bytes.
        options: the engine's policy choices.
        python: the interpreter whose packages resolve bases (None: kvref's own).
    """
    from kvref.audit.pipeline import analyze, summarize_file

    environment = discover_environment(python, project_root=root)
    use_interpreter(environment.python, environment.version)
    target = absolute_path(target)

    def summarize_many(paths: Sequence[Path]) -> Mapping[Path, ModuleSummary | FileError]:
        return {
            path: summary_or_error(relative_path(path, root), source, summarize)
            if path == target
            else summarize_file(path, root, options.max_file_bytes)
            for path in paths
        }

    return analyze(
        [path for path in project_files if absolute_path(path) != target] + [target],
        root=root,
        report_files=[target],
        options=options,
        search_paths=environment.search_paths,
        package_roots=environment.package_roots,
        import_roots=environment.import_roots,
        summarize_many=summarize_many,
    )
