"""Baselines: accept the findings a project already has, report only new ones.

`kvref audit --write-baseline .kvref-baseline.json` records every current finding as an entry
keyed by (path, code, symbol) with a count, never by line, so edits that move code do not
invalidate it. `--baseline FILE` (or `baseline = ...` in `[tool.kvref]`) then hides up to
`count` findings per key; the rest are reported as usual. Entries that match fewer findings
than recorded are stale (the code was fixed or renamed) and are listed in the summary so the
file can be regenerated.

File format (sorted, so regenerating it gives a small diff):

    {"kvref_baseline": 1,
     "entries": [{"path": "pkg/tier.py", "code": "KVR001",
                  "symbol": "FsTier.on_request_finished", "count": 1}, ...]}
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from kvref.audit.atomic import write_atomically
from kvref.audit.model import Finding
from kvref.errors import KVRefError

__all__ = [
    "BASELINE_FORMAT_VERSION",
    "BaselineError",
    "BaselineKey",
    "Baseline",
    "BaselineOutcome",
    "baseline_key",
    "load_baseline",
    "write_baseline",
    "apply_baseline",
    "apply_scoped_baseline",
    "record_baseline",
]

BASELINE_FORMAT_VERSION = 1

BaselineKey = tuple[str, str, str]
"""(project-relative path, code, qualified symbol)."""


class BaselineError(KVRefError):
    """A baseline file is missing, unreadable or malformed."""


@dataclass(frozen=True, slots=True)
class Baseline:
    """How many findings are accepted for each (path, code, symbol)."""

    counts: Mapping[BaselineKey, int] = field(default_factory=lambda: {})


@dataclass(frozen=True, slots=True)
class BaselineOutcome:
    """Findings split by a baseline.

    Attributes:
        new: findings the baseline does not cover (reported).
        baselined: how many findings it covers (hidden).
        stale: entries that match fewer findings than recorded, with the unmatched count.
    """

    new: list[Finding]
    baselined: int
    stale: list[tuple[BaselineKey, int]]


def baseline_key(finding: Finding) -> BaselineKey:
    """The key a finding is baselined under."""
    return (finding.path, finding.code, finding.symbol)


def load_baseline(path: Path) -> Baseline:
    """Read a baseline file.

    Raises:
        BaselineError: the file is missing, not JSON, or not in the format above.
    """
    try:
        document: object = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise BaselineError(
            f"{path}: baseline not found (create it with --write-baseline {path})"
        ) from exc
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read baseline: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: baseline is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise BaselineError(f"{path}: baseline must be a JSON object")
    document = cast(dict[str, object], document)
    if document.get("kvref_baseline") != BASELINE_FORMAT_VERSION:
        raise BaselineError(
            f"{path}: not a kvref baseline of format {BASELINE_FORMAT_VERSION} "
            f'(expected "kvref_baseline": {BASELINE_FORMAT_VERSION})'
        )
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise BaselineError(f'{path}: "entries" must be a list')
    counts: Counter[BaselineKey] = Counter()
    for index, entry in enumerate(cast(list[object], entries)):
        if not isinstance(entry, dict):
            raise BaselineError(f"{path}: entry {index} must be an object")
        entry = cast(dict[str, object], entry)
        fields = (entry.get("path"), entry.get("code"), entry.get("symbol"))
        count = entry.get("count", 1)
        if not all(isinstance(value, str) for value in fields) or not (
            isinstance(count, int) and not isinstance(count, bool) and count > 0
        ):
            raise BaselineError(
                f"{path}: entry {index} needs string path, code, symbol and a positive count"
            )
        counts[cast(BaselineKey, fields)] += count
    return Baseline(dict(counts))


def write_baseline(
    path: Path, findings: Iterable[Finding], keep: Mapping[BaselineKey, int] | None = None
) -> int:
    """Record `findings` in a baseline file (atomically); returns the number of entries.

    Args:
        path: the baseline file.
        findings: the findings to record.
        keep: entries carried over unchanged (those of files or rules this run did not look
            at, so a partial run does not drop them).

    Raises:
        BaselineError: the file cannot be written.
    """
    counts = Counter(baseline_key(finding) for finding in findings)
    for key, count in (keep or {}).items():
        counts[key] += count
    entries = [
        {"path": file, "code": code, "symbol": symbol, "count": count}
        for (file, code, symbol), count in sorted(counts.items())
    ]
    document = {"kvref_baseline": BASELINE_FORMAT_VERSION, "entries": entries}
    try:
        write_atomically(path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))
    except OSError as exc:
        raise BaselineError(f"{path}: cannot write baseline: {exc.strerror}") from exc
    return len(entries)


def apply_baseline(findings: Iterable[Finding], baseline: Baseline) -> BaselineOutcome:
    """Hide up to `count` findings per key; the first by position are the ones hidden."""
    remaining = dict(baseline.counts)
    new: list[Finding] = []
    baselined = 0
    for finding in sorted(findings, key=lambda f: (f.path, f.line, f.col, f.code)):
        key = baseline_key(finding)
        if remaining.get(key, 0) > 0:
            remaining[key] -= 1
            baselined += 1
        else:
            new.append(finding)
    stale = sorted((key, count) for key, count in remaining.items() if count > 0)
    return BaselineOutcome(new=new, baselined=baselined, stale=stale)


def _in_scope(key: BaselineKey, selected: frozenset[str], reported: set[str] | None) -> bool:
    return key[1] in selected and (reported is None or key[0] in reported)


def record_baseline(
    target: Path,
    findings: Sequence[Finding],
    *,
    selected: frozenset[str],
    reported: set[str] | None,
) -> int:
    """Write `target` for `findings`, keeping its entries for rules and files this run did not
    look at (a partial run: named paths, a narrower selection); returns the entry count.

    Args:
        selected: the codes this run enabled.
        reported: the project-relative paths it reported on (None: every file).
    """
    keep: dict[BaselineKey, int] = {}
    if target.exists():
        keep = {
            key: count
            for key, count in load_baseline(target).counts.items()
            if not _in_scope(key, selected, reported)
        }
    return write_baseline(target, findings, keep)


def apply_scoped_baseline(
    findings: list[Finding],
    path: Path | None,
    *,
    selected: frozenset[str],
    reported: set[str] | None,
) -> BaselineOutcome:
    """Hide the findings the baseline at `path` records (None: no baseline); entries for
    files or rules outside this run are not stale, just not looked at."""
    if path is None:
        return BaselineOutcome(new=findings, baselined=0, stale=[])
    outcome = apply_baseline(findings, load_baseline(path))
    outcome.stale[:] = [(key, count) for key, count in outcome.stale if _in_scope(key, selected, reported)]
    return outcome
