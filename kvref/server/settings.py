"""The settings `kvref server` takes: from its command line, then from the editor.

The editor's settings arrive in `initializationOptions` and in
`workspace/didChangeConfiguration`, either as the table itself or under a `kvref` key (what
generic clients send). Every key is optional; a key the editor sets replaces the command line's
value, and both override the project's `[tool.kvref]` only where `kvref audit`'s options would:

    {
      "python": ".venv/bin/python",     # --python: whose installed packages resolve bases
      "configuration": "kvref.toml",    # --config: instead of the nearest pyproject.toml
      "select": ["KVR0"], "extendSelect": ["KVR103"], "ignore": ["KVR102"],
      "run": "onType",                  # or "onSave": check only on open and save
      "debounce": 100,                  # ms after the last keystroke before checking
      "unsafeFixes": false,             # offer KVR101/KVR103's unsafe fixes (marked unsafe)
      "fixAll": true,                   # offer source.fixAll.kvref
      "disableRuleComment": true,       # offer "add # noqa: CODE"
      "cache": true,                    # share the summary cache with kvref audit
      "ruleDocs": "https://…/{code}"    # the codeDescription link (default: a local page)
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, cast

__all__ = ["DEFAULT_DEBOUNCE_MS", "ServerSettings", "parse_settings"]

DEFAULT_DEBOUNCE_MS = 100
"""How long after the last `didChange` the server waits before checking (typing goes on)."""

RunMode = Literal["onType", "onSave"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What the server was asked for (see the module docstring for the editor's spelling).

    Attributes:
        python: the interpreter whose packages resolve bases (None: as `kvref audit` finds it).
        configuration: a TOML file instead of the nearest `pyproject.toml`.
        select, extend_select, ignore: rule selectors on top of `[tool.kvref]`.
        run: check on every change ("onType", debounced) or only on open and save.
        debounce_ms: the wait after the last change.
        unsafe_fixes: offer unsafe fixes (marked unsafe).
        fix_all: offer `source.fixAll.kvref`.
        disable_rule_comment: offer the action that adds `# noqa: CODE`.
        cache: read and write the summary cache `kvref audit` uses.
        rule_docs: a URL with `{code}` for each diagnostic's documentation link (None: a page
            the server writes from the rule's own documentation).
    """

    python: Path | None = None
    configuration: Path | None = None
    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    run: RunMode = "onType"
    debounce_ms: int = DEFAULT_DEBOUNCE_MS
    unsafe_fixes: bool = False
    fix_all: bool = True
    disable_rule_comment: bool = True
    cache: bool = True
    rule_docs: str | None = None

    def analysis_key(self) -> tuple[object, ...]:
        """The settings a project's findings depend on (a change re-reads the project)."""
        return (self.python, self.configuration, self.select, self.extend_select, self.ignore, self.cache)


def _strings(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in cast(list[object], value)):
        raise ValueError(f"kvref server settings: {key} must be a list of strings, not {value!r}")
    return tuple(cast(list[str], value))


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"kvref server settings: {key} must be true or false, not {value!r}")
    return value


def _path(key: str, value: object) -> Path | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"kvref server settings: {key} must be a path string, not {value!r}")
    return Path(value).expanduser()


def parse_settings(raw: object, base: ServerSettings) -> ServerSettings:
    """`base` with the editor's settings applied.

    Args:
        raw: the editor's settings (None or an empty table: `base` unchanged).

    Raises:
        ValueError: an unknown key, or a value of the wrong type (the message names it).
    """
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise ValueError(f"kvref server settings: must be a table, not {raw!r}")
    table = cast(Mapping[str, object], raw)
    if "kvref" in table:
        nested = table["kvref"]
        if not isinstance(nested, Mapping):
            raise ValueError("kvref server settings: kvref must be a table")
        table = cast(Mapping[str, object], nested)
    settings = base
    for key, value in table.items():
        if key == "python":
            settings = replace(settings, python=_path(key, value))
        elif key == "configuration":
            settings = replace(settings, configuration=_path(key, value))
        elif key == "select":
            settings = replace(settings, select=None if value is None else _strings(key, value))
        elif key == "extendSelect":
            settings = replace(settings, extend_select=_strings(key, value))
        elif key == "ignore":
            settings = replace(settings, ignore=_strings(key, value))
        elif key == "run":
            if value not in ("onType", "onSave"):
                raise ValueError(f"kvref server settings: run must be 'onType' or 'onSave', not {value!r}")
            settings = replace(settings, run=value)
        elif key == "debounce":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10_000:
                raise ValueError(f"kvref server settings: debounce must be 0 to 10000 ms, not {value!r}")
            settings = replace(settings, debounce_ms=value)
        elif key == "unsafeFixes":
            settings = replace(settings, unsafe_fixes=_bool(key, value))
        elif key == "fixAll":
            settings = replace(settings, fix_all=_bool(key, value))
        elif key == "disableRuleComment":
            settings = replace(settings, disable_rule_comment=_bool(key, value))
        elif key == "cache":
            settings = replace(settings, cache=_bool(key, value))
        elif key == "ruleDocs":
            if value is not None and not (isinstance(value, str) and "{code}" in value):
                raise ValueError(f"kvref server settings: ruleDocs must be a URL with {{code}}, not {value!r}")
            settings = replace(settings, rule_docs=value)
        else:
            raise ValueError(
                f"kvref server settings: unknown key {key!r} (allowed: python, configuration, "
                "select, extendSelect, ignore, run, debounce, unsafeFixes, fixAll, "
                "disableRuleComment, cache, ruleDocs)"
            )
    return settings
