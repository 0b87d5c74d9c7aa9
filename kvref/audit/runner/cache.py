"""An on-disk cache of per-file summaries, so a warm `kvref audit` re-reads only what changed.

Layout: one packed file per cache version in the cache directory, holding for every source file
its size, mtime (ns), a content digest and its summary pickled on its own. A pack is read with
one `read` and one `marshal.loads` of plain values, which is what makes a warm run on thousands
of files cheap (one file per source file would cost an `open` per file before any work
starts); a summary is unpickled only when the run looks it up, so an audit that needs a
hundred of a project's ten thousand summaries pays for a hundred.

Validation, cheapest first:

- stat: size and mtime unchanged since the entry was written -> the summary is reused without
  reading the file. An entry whose mtime lies within `RACY_WINDOW_NS` of the moment the pack was
  written is "racy" (the file may have changed again within the same timestamp tick, the case
  git calls racy-git) and is never trusted on stat alone;
- digest: otherwise the file is read and hashed, and a matching digest still reuses the summary
  (a `touch`, a checkout that rewrote identical bytes), refreshing the stored stat;
- anything else is summarised again.

Safety: the pack is replaced atomically (temp file in the same directory + `os.replace`), so two
concurrent runs each see either the old or the new pack, never a torn one (the last writer wins,
losing at most the other's fresh entries, which are simply recomputed later). A pack that is
truncated, corrupt, from another kvref/Python version or schema, or holds anything but kvref's
own types is discarded and rebuilt, never trusted: the unpickler only constructs classes from
`kvref.audit` and a few builtin containers.
"""

from __future__ import annotations

import builtins
import copyreg
import dataclasses
import hashlib
import importlib
import io
import marshal
import operator
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, Protocol, TypeVar, cast

from typing_extensions import override

from kvref.audit.atomic import write_atomically

__all__ = [
    "CACHE_FORMAT",
    "StatLike",
    "dumps",
    "loads",
    "RACY_WINDOW_NS",
    "SummaryCache",
    "content_digest",
    "ensure_directory",
    "default_cache_dir",
    "version_stamp",
]

CACHE_FORMAT = 4
"""Bumped whenever the pack layout changes (part of every version stamp)."""

RACY_WINDOW_NS = 2_000_000_000
"""Files modified this close to the pack's write time are re-hashed rather than trusted."""

_MAGIC = b"KVRAUDC\x02"
# Builtins a summary may legitimately contain; everything else must come from kvref.audit.
_SAFE_BUILTINS = frozenset(
    {"frozenset", "set", "tuple", "list", "dict", "bytes", "str", "int", "float", "bool", "complex"}
)
_SAFE_MODULE_PREFIXES = ("kvref.audit.",)
_FAST_MODULES = ("kvref.audit.model", "kvref.audit.summarise.records", "kvref.audit.runner.parallel")

T = TypeVar("T")


class StatLike(Protocol):
    """The two fields of `os.stat_result` the cache validates with."""

    @property
    def st_size(self) -> int: ...

    @property
    def st_mtime_ns(self) -> int: ...


_Reducer = Callable[[object], tuple[Callable[..., object], tuple[object, ...]]]


def _constructor_reducers() -> dict[type, _Reducer]:
    """Reducers that rebuild kvref's frozen dataclasses by calling the class.

    The default pickling of a frozen slotted dataclass restores it through a Python
    `__setstate__` that recomputes `fields()` for every object; calling the constructor with
    the field values is several times cheaper, which matters with ~10^6 objects in the
    summaries of a large project.
    """
    reducers: dict[type, _Reducer] = {}
    for module_name in _FAST_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for candidate in vars(module).values():
            if not (isinstance(candidate, type) and dataclasses.is_dataclass(candidate)):
                continue
            cls = cast(type, candidate)
            fields = dataclasses.fields(cls)
            if cls.__module__ != module_name or not all(item.init for item in fields):
                continue
            getter = operator.attrgetter(*(item.name for item in fields))
            if len(fields) == 1:

                def reduce_one(
                    obj: object, cls: type = cls, getter: Callable[[object], object] = getter
                ) -> tuple[Callable[..., object], tuple[object, ...]]:
                    return (cls, (getter(obj),))

                reducers[cls] = reduce_one
            else:

                def reduce_many(
                    obj: object, cls: type = cls, getter: Callable[[object], object] = getter
                ) -> tuple[Callable[..., object], tuple[object, ...]]:
                    return (cls, cast(tuple[object, ...], getter(obj)))

                reducers[cls] = reduce_many
    return reducers


_dispatch_table: dict[type, _Reducer] | None = None


def _reducers() -> dict[type, _Reducer]:
    global _dispatch_table
    if _dispatch_table is not None:
        return _dispatch_table
    # Summaries are pickled one file at a time, and building the table costs more than
    # pickling a small summary: import every module with kvref dataclasses, build it once.
    for name in _FAST_MODULES:
        importlib.import_module(name)
    table = cast(dict[type, _Reducer], dict(copyreg.dispatch_table))
    table.update(_constructor_reducers())
    _dispatch_table = table
    return table


def dumps(value: object) -> bytes:
    """Pickle `value`, rebuilding kvref's dataclasses through their constructors."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _reducers()
    pickler.dump(value)
    return buffer.getvalue()


def loads(data: bytes) -> object:
    """Unpickle data written by `dumps`, refusing anything but kvref.audit types and builtins.

    Raises:
        pickle.UnpicklingError: the data names a class from elsewhere (or is corrupt).
    """
    return cast(object, _RestrictedUnpickler(io.BytesIO(data)).load())


def content_digest(data: bytes) -> bytes:
    """The digest that identifies a file's content (16 bytes of BLAKE2b)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def default_cache_dir(project_root: Path) -> Path:
    """`$KVREF_CACHE_DIR` if set, else `.kvref_cache` in the project root (like `.mypy_cache`)."""
    override = os.environ.get("KVREF_CACHE_DIR")
    return Path(override) if override else project_root / ".kvref_cache"


def version_stamp(schema_files: Iterable[Path] = ()) -> str:
    """A string that changes whenever a cached summary could mean something else.

    It covers the cache format, kvref's version, the Python implementation and version (the
    summaries come from that interpreter's `ast`), and the bytes of `schema_files` (the modules
    that define and compute the summaries, so a development checkout with an unchanged version
    number never reads summaries of an older shape).
    """
    from kvref import __version__

    digest = hashlib.blake2b(digest_size=8)
    for path in schema_files:
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(os.fsencode(path))
    return (
        f"{CACHE_FORMAT}-kvref{__version__}-{sys.implementation.name}"
        f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        f"-{digest.hexdigest()}"
    )


class _RestrictedUnpickler(pickle.Unpickler):
    """Constructs only kvref.audit classes and plain containers; anything else is corruption."""

    @override
    def find_class(self, module_name: str, global_name: str, /) -> object:
        if module_name == "builtins" and global_name in _SAFE_BUILTINS:
            return cast(object, getattr(builtins, global_name))
        if module_name.startswith(_SAFE_MODULE_PREFIXES):
            return super().find_class(module_name, global_name)
        raise pickle.UnpicklingError(f"refusing {module_name}.{global_name} in a kvref cache")


def ensure_directory(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ignore = directory / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# Created by kvref audit; safe to delete.\n*\n")


class _Entry:
    """One cached file: its stat, digest and summary, pickled and unpickled only when needed.

    The pack holds every summary as its own pickle, so loading the pack costs one `marshal`
    read whatever the project's size, a file's summary is rebuilt only when the run asks
    for it, and saving re-pickles only the summaries computed in this run.
    """

    __slots__ = ("size", "mtime_ns", "digest", "blob", "value", "decoded")

    def __init__(
        self, size: int, mtime_ns: int, digest: bytes, blob: bytes | None, value: object = None
    ) -> None:
        self.size = size
        self.mtime_ns = mtime_ns
        self.digest = digest
        self.blob = blob
        self.value = value
        self.decoded = blob is None


class SummaryCache(Generic[T]):
    """Per-file summaries cached on disk, validated by stat and by content digest.

    Use: `load()` once, `lookup`/`lookup_digest` per file, `store` what was computed, then
    `save()` (a no-op when nothing changed).

    Args:
        directory: the cache directory (created on save, with a `.gitignore` of `*`); None
            keeps the summaries of one run in memory (`--no-cache`): nothing is read or
            written, and a file's entry is trusted by its stat as of when the run began.
        stamp: the version stamp (see `version_stamp`); packs of other stamps are never read.
    """

    def __init__(self, directory: Path | None, stamp: str) -> None:
        self.directory = directory
        self.stamp = stamp
        self._entries: dict[str, _Entry] = {}
        self._stored: list[str] = []
        # In memory, entries count as written when the run began (see `_fresh`).
        self._written_at_ns = 0 if directory is not None else time.time_ns()
        self._dirty = False
        self._loaded = directory is None
        self.discarded: str | None = None
        """Why an existing pack (or one entry of it) was thrown away, for diagnostics."""
        self.hits = 0
        self.misses = 0

    @property
    def persistent(self) -> bool:
        """Whether the summaries are kept on disk (False: in memory, for one run)."""
        return self.directory is not None

    @property
    def pack_path(self) -> Path:
        assert self.directory is not None, "an in-memory summary cache has no pack"
        digest = hashlib.blake2b(self.stamp.encode(), digest_size=6).hexdigest()
        return self.directory / f"summaries-{digest}.pack"

    def __len__(self) -> int:
        return len(self._entries)

    def load(self) -> None:
        """Read the pack, if any; a pack that fails any check is dropped (never raises)."""
        self._loaded = True
        if self.directory is None:
            return
        try:
            data = self.pack_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as error:
            self.discarded = f"unreadable: {error}"
            return
        try:
            self._entries, self._written_at_ns = self._decode(data)
        except Exception as error:  # noqa: BLE001 - any decoding failure means "not trusted"
            self._entries, self._written_at_ns = {}, 0
            self.discarded = f"{type(error).__name__}: {error}"
            # Rewrite it on the next save even if this run computes nothing new.
            self._dirty = True

    def _decode(self, data: bytes) -> tuple[dict[str, _Entry], int]:
        if not data.startswith(_MAGIC):
            raise ValueError("not a kvref cache pack")
        # marshal builds only plain values (no code runs); each summary stays a pickle until
        # it is looked up, and is then unpickled with the restricted unpickler.
        header = marshal.loads(data[len(_MAGIC) :])
        if not (isinstance(header, tuple) and len(cast(tuple[object, ...], header)) == 3):
            raise ValueError("malformed pack header")
        stamp, written_at_ns, rows = cast(tuple[object, object, object], header)
        if stamp != self.stamp:
            raise ValueError(f"foreign cache version {stamp!r}")
        if not isinstance(written_at_ns, int) or not isinstance(rows, dict):
            raise ValueError("malformed pack body")
        entries: dict[str, _Entry] = {}
        for key, row in cast(dict[object, object], rows).items():
            fields = cast(tuple[object, ...], row) if isinstance(row, tuple) else ()
            if not (isinstance(key, str) and len(fields) == 4):
                raise ValueError("malformed pack entry")
            size, mtime_ns, digest, blob = fields
            if not (
                isinstance(size, int)
                and isinstance(mtime_ns, int)
                and isinstance(digest, bytes)
                and isinstance(blob, bytes)
            ):
                raise ValueError("malformed pack entry")
            entries[key] = _Entry(size, mtime_ns, digest, blob)
        return entries, written_at_ns

    def _value(self, key: str, entry: _Entry) -> T | None:
        """The entry's summary, unpickled on first use; a corrupt one is dropped (a miss)."""
        if not entry.decoded:
            assert entry.blob is not None
            try:
                entry.value = loads(entry.blob)
            except Exception as error:  # noqa: BLE001 - a bad entry is recomputed, not trusted
                del self._entries[key]
                self.discarded = f"entry for {key}: {type(error).__name__}: {error}"
                self._dirty = True
                return None
            entry.decoded = True
        return cast(T, entry.value)

    def _fresh(self, key: str, stat: StatLike) -> _Entry | None:
        entry = self._entries.get(key)
        if (
            entry is not None
            and entry.size == stat.st_size
            and entry.mtime_ns == stat.st_mtime_ns
            and entry.mtime_ns < self._written_at_ns - RACY_WINDOW_NS
        ):
            return entry
        return None

    def lookup(self, path: Path, stat: StatLike) -> T | None:
        """The cached summary of `path` if its size and mtime prove it unchanged, else None."""
        key = str(path)
        entry = self._fresh(key, stat)
        if entry is not None:
            value = self._value(key, entry)
            if value is not None:
                self.hits += 1
            return value
        return None

    def lookup_pickled(self, path: Path, stat: StatLike) -> bytes | None:
        """Like `lookup`, but the entry's pickle as stored, for a caller that unpickles it
        later (or elsewhere); None when the stat does not match or it is already unpickled.

        The pickle is not checked here: whoever loads it must treat a failure as a miss.
        """
        entry = self._fresh(str(path), stat)
        if entry is None or entry.decoded or entry.blob is None:
            return None
        self.hits += 1
        return entry.blob

    def expected_digest(self, path: Path) -> bytes | None:
        """The digest stored for `path`, to compare with the file's bytes when stat differs."""
        entry = self._entries.get(str(path))
        return None if entry is None else entry.digest

    def lookup_digest(self, path: Path, digest: bytes, stat: StatLike) -> T | None:
        """The cached summary when the content is unchanged; refreshes the stored stat."""
        key = str(path)
        entry = self._entries.get(key)
        if entry is None or entry.digest != digest:
            return None
        value = self._value(key, entry)
        if value is None:
            return None
        self.hits += 1
        racy = entry.mtime_ns >= self._written_at_ns - RACY_WINDOW_NS
        if racy or entry.size != stat.st_size or entry.mtime_ns != stat.st_mtime_ns:
            # Rewriting moves the pack's write time past this mtime, so the next run can trust
            # the stat alone again.
            entry.size, entry.mtime_ns = stat.st_size, stat.st_mtime_ns
            self._dirty = True
        return value

    def store(self, path: Path, stat: StatLike, digest: bytes, value: T) -> None:
        """Remember the summary computed from the bytes whose stat and digest are given
        (pickled when the cache is saved; `store_pickled` keeps a pickle as it is).

        Args:
            path, stat, digest: the file, and the stat and digest of the bytes summarised.
            value: the summary.
        """
        self.misses += 1
        entry = _Entry(stat.st_size, stat.st_mtime_ns, digest, None, value)
        entry.decoded = True
        self._entries[str(path)] = entry
        self._stored.append(str(path))
        self._dirty = True

    def store_pickled(self, path: Path, stat: StatLike, digest: bytes, pickled: bytes) -> None:
        """Like `store`, for a summary known only in its pickled form (`dumps` of it)."""
        self.misses += 1
        self._entries[str(path)] = _Entry(stat.st_size, stat.st_mtime_ns, digest, pickled)
        self._stored.append(str(path))
        self._dirty = True

    @property
    def stored_count(self) -> int:
        """How many entries this run has stored so far (a mark for `export_stored`)."""
        return len(self._stored)

    def export_stored(self, since: int = 0) -> bytes:
        """The entries stored after mark `since`, as bytes for `import_stored`.

        A forked process that summarised files (modules its lookups reached) sends these to
        its parent, so what it learned is saved with the parent's cache.
        """
        rows: list[tuple[str, int, int, bytes, bytes]] = []
        for key in dict.fromkeys(self._stored[since:]):
            entry = self._entries.get(key)
            if entry is None:
                continue
            if entry.blob is None:
                entry.blob = dumps(entry.value)
            rows.append((key, entry.size, entry.mtime_ns, entry.digest, entry.blob))
        return marshal.dumps(rows)

    def import_stored(self, data: bytes) -> None:
        """Add the entries `export_stored` wrote (elsewhere); entries this cache has win.

        Raises:
            ValueError: the data is not what `export_stored` writes.
        """
        rows = marshal.loads(data)
        if not isinstance(rows, list):
            raise ValueError("malformed exported entries")
        entries: dict[str, _Entry] = {}  # all checked before any is kept
        for row in cast(list[object], rows):
            fields = cast(tuple[object, ...], row) if isinstance(row, tuple) else ()
            if len(fields) != 5:
                raise ValueError("malformed exported entry")
            key, size, mtime_ns, digest, blob = fields
            if not (
                isinstance(key, str)
                and isinstance(size, int)
                and isinstance(mtime_ns, int)
                and isinstance(digest, bytes)
                and isinstance(blob, bytes)
            ):
                raise ValueError("malformed exported entry")
            entries[key] = _Entry(size, mtime_ns, digest, blob)
        for key, entry in entries.items():
            if key not in self._entries:
                self._entries[key] = entry
                self._dirty = True

    def forget_missing(self, keep: Iterable[Path]) -> None:
        """Drop entries of files that no longer exist (those in `keep` are known to exist)."""
        known = {str(path) for path in keep}
        for key in [key for key in self._entries if key not in known]:
            if not os.path.exists(key):
                del self._entries[key]
                self._dirty = True

    def save(self) -> None:
        """Write the pack atomically if anything changed; failures leave the old pack intact.

        Raises:
            OSError: the directory cannot be created or written (callers may ignore it: the
                next run simply recomputes).
        """
        if not self._dirty or self.directory is None:
            return
        ensure_directory(self.directory)
        rows: dict[str, tuple[int, int, bytes, bytes]] = {}
        for key, entry in self._entries.items():
            if entry.blob is None:
                entry.blob = dumps(entry.value)
            rows[key] = (entry.size, entry.mtime_ns, entry.digest, entry.blob)
        payload = marshal.dumps((self.stamp, time.time_ns(), rows))
        write_atomically(self.pack_path, _MAGIC + payload, durable=False)
        self._dirty = False
