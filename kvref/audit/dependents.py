"""A partial run's dependents: the classes outside the reported files that derive from a class
defined in one (renaming a base method makes an unchanged subclass's `@override` stale, and the
commit that did it must see that), and which class a finding belongs to."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from kvref.audit.resolve.hierarchy import ProjectIndex
from kvref.audit.resolve.targets import ClassKey
from kvref.audit.summarise.records import ModuleSummary

__all__ = ["dependent_classes", "owning_class"]


def owning_class(symbol: str, summary: ModuleSummary) -> str:
    """The innermost class of `summary` that a finding's symbol (`Class.method[.param]`) is in."""
    qualnames = {cls.qualname for cls in summary.classes}
    owner = symbol
    while owner:
        owner = owner.rpartition(".")[0]
        if owner in qualnames:
            return owner
    return ""


def dependent_classes(
    reported: Collection[Path], summarised: Collection[Path], primary: Mapping[Path, str], index: ProjectIndex
) -> dict[Path, frozenset[str]]:
    """The classes outside the `reported` files that derive from a class defined in one.

    Returns:
        For each unreported file with such classes, their qualified names, and the names of
        the classes nested in them (a finding's symbol is `Class.method`).
    """
    changed_modules = {primary[path] for path in reported if path in primary}
    others = {
        path: summary
        for path in sorted(summarised)
        if path not in reported and (summary := index.module(primary[path])) is not None
    }
    # Which classes can derive from a changed one is first decided by name (a base spelled
    # `Base` or `mod.Base`), growing the names with each subclass found, so that only the
    # few candidate classes have their MROs resolved.
    names: set[str] = set()
    for path in reported:
        summary = index.module(primary[path]) if path in summarised else None
        if summary is not None:
            names.update(cls.name for cls in summary.classes)
    candidates: dict[Path, list[str]] = {}
    grew = True
    while grew:
        grew = False
        for path, summary in others.items():
            for cls in summary.classes:
                if cls.qualname in candidates.get(path, ()):
                    continue
                if any(base.dotted.rpartition(".")[2] in names for base in cls.bases):
                    candidates.setdefault(path, []).append(cls.qualname)
                    if cls.name not in names:
                        names.add(cls.name)
                        grew = True
    dependents: dict[Path, frozenset[str]] = {}
    for path, qualnames in candidates.items():
        affected = {
            qualname
            for qualname in qualnames
            if any(
                ancestor.module in changed_modules
                for ancestor in index.known_ancestors(ClassKey(primary[path], qualname))
            )
        }
        if affected:
            dependents[path] = frozenset(affected)
    return dependents
