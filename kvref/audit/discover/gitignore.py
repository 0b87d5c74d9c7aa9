"""Glob matching for `exclude`/`per-file-ignores`, and `.gitignore` semantics for the walker.

`matches_glob` serves the configuration's globs. `parse_gitignore` + `IgnoreMatcher` implement
what `discover` needs outside a git work tree: comments, blank lines, `!` negation, trailing
`/` (directories only), anchoring by a leading or inner `/`, `*`, `?`, `[...]` and `**`;
`is_gitignored` states the same semantics rule by rule (the tests compare the two).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "GitignoreRule",
    "IgnoreMatcher",
    "excluded_by",
    "glob_regex",
    "is_gitignored",
    "matches_glob",
    "parse_gitignore",
]


# --- glob matching (config `exclude`, `per-file-ignores`, and .gitignore patterns) ---


def glob_regex(pattern: str) -> str:
    """A gitignore-style glob as a regex over '/'-separated paths (no anchors added)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern == "**":
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            # Git treats any other run of asterisks like a single one.
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            j = i + 1
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1 : j]
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            out.append("[" + ("^/" if negated else "") + body.replace("\\", "\\\\") + "]")
            i = j + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(glob_regex(pattern), re.DOTALL)


def matches_glob(pattern: str, rel_path: str) -> bool:
    """Whether a project-relative '/' path matches an `exclude`/`per-file-ignores` glob.

    A pattern without '/' matches any path component (`build`, `*_pb2.py`); one with '/' is
    anchored at the project root and matches the path or any directory above it
    (`tests/fixtures`, `src/**/generated_*.py`). `**` spans directories.
    """
    parts = rel_path.strip("/").split("/")
    body = pattern.strip().rstrip("/")
    if "/" not in body:
        regex = _compiled(body)
        return any(regex.fullmatch(part) for part in parts)
    regex = _compiled(body.lstrip("/"))
    return any(regex.fullmatch("/".join(parts[:k])) for k in range(1, len(parts) + 1))


def excluded_by(rel_path: str, excludes: Sequence[str]) -> bool:
    """Whether any of the `excludes` globs matches `rel_path` (see `matches_glob`)."""
    return any(matches_glob(pattern, rel_path) for pattern in excludes)


# --- .gitignore (only used outside a git work tree) ---


@dataclass(frozen=True, slots=True)
class GitignoreRule:
    """One pattern line of a .gitignore file at directory `base` (root-relative, '' = root)."""

    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    base: str
    name_regex: re.Pattern[str] | None = None
    """For a pattern without '/': the same test on the last path component alone."""


def parse_gitignore(text: str, base: str) -> list[GitignoreRule]:
    """The rules of one .gitignore file whose directory is `base` (root-relative)."""
    rules: list[GitignoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        # Trailing spaces are ignored unless escaped with a backslash.
        stripped = line.rstrip(" ")
        if stripped.endswith("\\") and len(line) > len(stripped):
            stripped += " "
        line = stripped
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        name_regex = None
        if "/" in line:
            regex = re.compile(glob_regex(line.lstrip("/")), re.DOTALL)
        else:
            regex = re.compile("(?:.*/)?" + glob_regex(line), re.DOTALL)
            name_regex = re.compile(glob_regex(line), re.DOTALL)
        rules.append(
            GitignoreRule(
                regex=regex, negate=negate, dir_only=dir_only, base=base, name_regex=name_regex
            )
        )
    return rules


def is_gitignored(rules: Iterable[GitignoreRule], rel_path: str, *, is_dir: bool) -> bool:
    """Whether `rel_path` is ignored: the last matching rule wins, `!` re-includes.

    The rule-by-rule statement of the semantics; the walker uses the compiled `IgnoreMatcher`,
    which is tested against this.
    """
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.base:
            if not rel_path.startswith(rule.base + "/"):
                continue
            sub_path = rel_path[len(rule.base) + 1 :]
        else:
            sub_path = rel_path
        if rule.regex.fullmatch(sub_path):
            ignored = not rule.negate
    return ignored


_Segment = tuple[str, "_Alternation | None", "_Alternation | None"]
"""One .gitignore: its directory, and its rules for files and for directories."""


class IgnoreMatcher:
    """`is_gitignored` for one directory's rule list, with one regex match per .gitignore.

    The rules of each .gitignore are joined into one alternation in reverse order, so the
    alternative that matches is the file's last matching rule (`lastgroup` names it), and
    the files are tried from the deepest up: the first that matches decides, as the last
    matching rule does in git. A walk tests every entry, and a project's .gitignore often
    has a hundred rules.

    Use: `IgnoreMatcher().extended(parse_gitignore(root_text, "")).extended(deeper_rules)`,
    one `extended` per .gitignore from the root down, then `ignored(rel_path, is_dir=...)`.
    """

    __slots__ = ("_segments",)

    def __init__(self, segments: Sequence[_Segment] = ()) -> None:
        self._segments = list(segments)  # the deepest .gitignore first

    def extended(self, rules: Sequence[GitignoreRule]) -> IgnoreMatcher:
        """This matcher with the rules of one more (deeper) .gitignore file."""
        if not rules:
            return self
        files = _Alternation.of([rule for rule in rules if not rule.dir_only])
        segment = (rules[0].base, files, _Alternation.of(rules))
        return IgnoreMatcher([segment, *self._segments])

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        name = rel_path.rpartition("/")[2]
        for base, files, dirs in self._segments:
            alternation = dirs if is_dir else files
            if alternation is None:
                continue
            if base:
                if not rel_path.startswith(base) or rel_path[len(base) : len(base) + 1] != "/":
                    continue
                sub_path = rel_path[len(base) + 1 :]
            else:
                sub_path = rel_path
            last = alternation.last_match(name, sub_path)
            if last is not None:
                return not alternation.negate[last]
        return False


@dataclass(frozen=True, slots=True)
class _Alternation:
    """One .gitignore's rules as (at most) two regexes; see `last_match`."""

    by_name: re.Pattern[str] | None
    by_path: re.Pattern[str] | None
    negate: tuple[bool, ...]

    @staticmethod
    def of(rules: Sequence[GitignoreRule]) -> _Alternation | None:
        if not rules:
            return None

        def joined(patterns: list[str]) -> re.Pattern[str] | None:
            return re.compile("|".join(patterns), re.DOTALL) if patterns else None

        # Reversed, so the alternative that matches is the last matching rule; a group's
        # name is the rule's position in the file.
        by_name: list[str] = []
        by_path: list[str] = []
        for index in reversed(range(len(rules))):
            rule = rules[index]
            if rule.name_regex is not None:
                by_name.append(f"(?P<r{index}>{rule.name_regex.pattern})")
            else:
                by_path.append(f"(?P<r{index}>{rule.regex.pattern})")
        return _Alternation(joined(by_name), joined(by_path), tuple(r.negate for r in rules))

    def last_match(self, name: str, sub_path: str) -> int | None:
        """The position of the last rule matching the entry: patterns without '/' test its
        name alone (cheaper than `(?:.*/)?...` on the whole path, the same answer), the
        others its path below the .gitignore's directory."""
        found: int | None = None
        for regex, text in ((self.by_name, name), (self.by_path, sub_path)):
            match = regex.fullmatch(text) if regex is not None else None
            if match is not None:
                index = int((match.lastgroup or "r0")[1:])
                found = index if found is None else max(found, index)
        return found
