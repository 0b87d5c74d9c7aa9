"""Auditing text that is not on disk: `kvref audit - --stdin-filename PATH` (editors), and the
unsaved buffers of `kvref server`.

The text is summarised as the module at PATH, every other project file as it is on disk, so
names resolve across the project as if the text had been saved there; nothing is cached (the
caches describe the files on disk) and nothing is written. The project is PATH's, found from
PATH as for a named file (`kvref.audit.run`), whatever the current directory.

`analyze_texts` is the general form: several files' texts at once (an editor's open buffers),
each summarised from its text, with the caller choosing how the files on disk are summarised
(the server keeps them in memory between edits).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from kvref.audit.discover.environment import discover_environment
from kvref.audit.discover.paths import absolute_path, relative_path
from kvref.audit.model import AnalysisOptions, AnalysisResult, FileError
from kvref.audit.summarise.newer_syntax import use_interpreter
from kvref.audit.source import summary_or_error
from kvref.audit.summarise.summary import ModuleSummary, summarize

__all__ = ["SummarizeText", "analyze_source", "analyze_texts"]

SummarizeText = Callable[[Path, bytes], ModuleSummary | FileError]
"""Summarises one file's text (absolute path, bytes): a summary or the file's error."""


def analyze_texts(
    project_files: Sequence[Path],
    *,
    root: Path,
    texts: Mapping[Path, bytes],
    report_files: Collection[Path],
    options: AnalysisOptions,
    search_paths: Sequence[Path] = (),
    package_roots: Sequence[tuple[str, Path]] = (),
    import_roots: Sequence[Path] = (),
    summarize_disk: Callable[[Path], ModuleSummary | FileError] | None = None,
    summarize_text: SummarizeText | None = None,
) -> AnalysisResult:
    """The findings for `report_files`, the files in `texts` audited from those texts.

    Args:
        project_files: the project's files (those of `texts` and `report_files` are added
            when missing).
        root: the project root.
        texts: absolute path -> the bytes to audit in place of the file's (it need not exist).
        report_files: the files to report on (absolute).
        options: the engine's policy choices.
        search_paths, package_roots, import_roots: as for `kvref.audit.pipeline.analyze`.
        summarize_disk: summarises a file as it is on disk (default: read and parse it).
        summarize_text: summarises a file from its text (default: parse it).
    """
    from kvref.audit.pipeline import analyze, summarize_file

    overlays = {absolute_path(path): source for path, source in texts.items()}

    def from_text(path: Path, source: bytes) -> ModuleSummary | FileError:
        if summarize_text is not None:
            return summarize_text(path, source)
        return summary_or_error(relative_path(path, root), source, summarize)

    def summarize_many(paths: Sequence[Path]) -> Mapping[Path, ModuleSummary | FileError]:
        return {
            path: from_text(path, overlays[path])
            if path in overlays
            else summarize_disk(path)
            if summarize_disk is not None
            else summarize_file(path, root, options.max_file_bytes)
            for path in paths
        }

    added = list(dict.fromkeys([*overlays, *map(absolute_path, report_files)]))
    known = set(added)
    return analyze(
        [path for path in project_files if absolute_path(path) not in known] + added,
        root=root,
        report_files=report_files,
        options=options,
        search_paths=search_paths,
        package_roots=package_roots,
        import_roots=import_roots,
        summarize_many=summarize_many,
    )


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
    environment = discover_environment(python, project_root=root)
    use_interpreter(environment.python, environment.version)
    target = absolute_path(target)
    return analyze_texts(
        project_files,
        root=root,
        texts={target: source},
        report_files=[target],
        options=options,
        search_paths=environment.search_paths,
        package_roots=environment.package_roots,
        import_roots=environment.import_roots,
    )
