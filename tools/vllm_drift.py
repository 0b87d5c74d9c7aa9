"""Where kvref's reference differs from vLLM's `kv_offload`: names, members, signatures.

    .venv/bin/python tools/vllm_drift.py                   # against vLLM 0.33.0, the release kvref names
    .venv/bin/python tools/vllm_drift.py --vllm 0.34.0     # what a migration to another release touches
    .venv/bin/python tools/vllm_drift.py --all             # documented differences too, with their reasons

Both sides are read as source (`ast`), never imported: vLLM's from its published sdist (fetched
into kvref's cache outside the repository, any release), kvref's from the checkout. For each pair
of modules in `MODULES`, every public name of vLLM's module is looked for in kvref's, and each
class's public members (methods, properties, class attributes and fields, attributes `__init__`
sets on `self`, those of its bases among the compared classes included) in kvref's class. A
function or method's signature is compared parameter by parameter: name, kind, default and
annotation, and its return annotation. Annotations compare as text once module prefixes, quotes
and `Optional`/`Union` spellings are normalised. What kvref has and vLLM lacks is not reported.

Each difference is checked against docs/VLLM_DIFFERENCES.md, the one place where kvref's
deliberate differences are listed with their reasons (its first table: module, name, kind, what,
reason). Prints the differences (undocumented ones always; documented ones with `--all`) and
exits 1 if any is undocumented.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._audit_corpus import fetch_corpus

__all__ = ["MODULES", "Difference", "differences", "documented", "main"]

CHECKOUT = Path(__file__).resolve().parent.parent
DIFFERENCES_DOC = CHECKOUT / "docs" / "VLLM_DIFFERENCES.md"

MODULES: dict[str, tuple[str, ...]] = {
    "vllm/v1/kv_offload/base.py": (
        "kvref/base.py", "kvref/request.py", "kvref/specs.py", "kvref/stats.py", "kvref/transfer.py",
    ),
    "vllm/v1/kv_offload/config.py": ("kvref/config.py",),
    "vllm/v1/metrics/cache_hit_source.py": ("kvref/cache_hit_source.py",),
    "vllm/v1/kv_offload/cpu/common.py": ("kvref/cpu/common.py",),
    "vllm/v1/kv_offload/cpu/manager.py": ("kvref/cpu/manager.py",),
    "vllm/v1/kv_offload/cpu/policies/base.py": ("kvref/cpu/policies/base.py",),
    "vllm/v1/kv_offload/cpu/policies/lru.py": ("kvref/cpu/policies/lru.py",),
    "vllm/v1/kv_offload/cpu/policies/arc.py": ("kvref/cpu/policies/arc.py",),
    "vllm/v1/kv_offload/cpu/policies/factory.py": ("kvref/cpu/policies/factory.py",),
    "vllm/v1/kv_offload/tiering/base.py": ("kvref/tiering/base.py",),
    "vllm/v1/kv_offload/tiering/backpressure.py": ("kvref/tiering/backpressure.py",),
    "vllm/v1/kv_offload/tiering/async_lookup.py": ("kvref/tiering/async_lookup.py",),
    "vllm/v1/kv_offload/tiering/metrics.py": ("kvref/tiering/metrics.py",),
    "vllm/v1/kv_offload/tiering/manager.py": (
        "kvref/tiering/manager.py", "kvref/tiering/jobs.py", "kvref/tiering/primary.py",
        "kvref/tiering/poll_thread.py",
    ),
}  # fmt: skip
"""vLLM's module (relative to its sdist) -> the kvref modules that hold its counterparts."""

_KINDS = ("missing", "kind", "parameters", "default", "annotation", "returns")


@dataclass(frozen=True, order=True)
class Difference:
    """One way kvref differs from vLLM.

    Attributes:
        module: vLLM's module, relative to its sdist.
        name: the name in it (`Class.member` for a member).
        kind: "missing", "kind" (a function in one, a class in the other...), "parameters"
            (names or kinds), "default", "annotation" (of a parameter) or "returns".
        what: the detail, e.g. "keys: Iterable[OffloadKey] -> Collection[OffloadKey]".
    """

    module: str
    name: str
    kind: str
    what: str


@dataclass(frozen=True)
class _Param:
    name: str
    kind: str  # posonly, normal, *args, kwonly, **kwargs
    default: str | None
    annotation: str | None


@dataclass(frozen=True)
class _Member:
    kind: str  # function, class, property, attribute
    params: tuple[_Param, ...] = ()
    returns: str | None = None


def _normalise(text: str | None) -> str | None:
    """Annotation text without quotes, module prefixes or Optional/Union spellings."""
    if text is None:
        return None
    text = text.replace('"', "").replace("'", "")
    text = re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)
    text = re.sub(r"\bOptional\[(.*)\]$", r"\1 | None", text)
    union = re.fullmatch(r"Union\[(.*)\]", text)
    if union:
        text = " | ".join(part.strip() for part in union.group(1).split(","))
    return re.sub(r"\s+", " ", text).strip()


def _default(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    try:
        return repr(ast.literal_eval(node))
    except ValueError:
        return _normalise(ast.unparse(node))


def _signature(function: ast.FunctionDef | ast.AsyncFunctionDef) -> _Member:
    arguments = function.args
    params: list[_Param] = []
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    for index, (argument, default) in enumerate(zip(positional, defaults)):
        kind = "posonly" if index < len(arguments.posonlyargs) else "normal"
        params.append(_Param(argument.arg, kind, _default(default), _annotation(argument.annotation)))
    if arguments.vararg is not None:
        params.append(_Param(arguments.vararg.arg, "*args", None, _annotation(arguments.vararg.annotation)))
    for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        params.append(_Param(argument.arg, "kwonly", _default(default), _annotation(argument.annotation)))
    if arguments.kwarg is not None:
        params.append(_Param(arguments.kwarg.arg, "**kwargs", None, _annotation(arguments.kwarg.annotation)))
    decorators = {ast.unparse(decorator) for decorator in function.decorator_list}
    kind = "property" if decorators & {"property", "cached_property", "functools.cached_property"} else "function"
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return _Member(kind, tuple(params), _annotation(function.returns))


def _annotation(node: ast.expr | None) -> str | None:
    return None if node is None else _normalise(ast.unparse(node))


def _class_members(node: ast.ClassDef) -> dict[str, _Member]:
    members: dict[str, _Member] = {}
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            if statement.name == "__init__":
                members.update(_self_attributes(statement))
                members["__init__"] = _signature(statement)
            elif statement.name not in members or members[statement.name].kind != "property":
                members[statement.name] = _signature(statement)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            members[statement.target.id] = _Member("attribute")
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    members[target.id] = _Member("attribute")
    return {name: member for name, member in members.items() if not name.startswith("_") or name == "__init__"}


def _self_attributes(init: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, _Member]:
    found: dict[str, _Member] = {}
    for node in ast.walk(init):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found[target.attr] = _Member("attribute")
    return found


@dataclass
class _Module:
    """The public names of one module (or of kvref's modules that stand for one of vLLM's)."""

    names: dict[str, _Member]
    classes: dict[str, tuple[dict[str, _Member], list[str]]]  # name -> (own members, base names)


def _read(paths: Sequence[Path]) -> _Module:
    module = _Module({}, {})
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for statement in tree.body:
            if isinstance(statement, ast.ClassDef):
                bases = [ast.unparse(base).rpartition(".")[2] for base in statement.bases]
                module.classes[statement.name] = (_class_members(statement), bases)
                module.names[statement.name] = _Member("class")
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                module.names[statement.name] = _signature(statement)
            elif isinstance(statement, ast.Assign | ast.AnnAssign):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        module.names[target.id] = _Member("attribute")
    module.names = {name: member for name, member in module.names.items() if not name.startswith("_")}
    return module


def _all_members(cls: str, classes: dict[str, tuple[dict[str, _Member], list[str]]]) -> dict[str, _Member]:
    """A class's members, with those of its bases among `classes` (a subclass's win)."""
    if cls not in classes:
        return {}
    own, bases = classes[cls]
    members: dict[str, _Member] = {}
    for base in reversed(bases):
        members.update(_all_members(base, classes))
    members.update(own)
    return members


def _compare_member(module: str, name: str, theirs: _Member, ours: _Member) -> Iterator[Difference]:
    if theirs.kind != ours.kind:
        yield Difference(module, name, "kind", f"{theirs.kind} -> {ours.kind}")
        return
    if theirs.kind not in ("function", "property"):
        return
    shape = [(param.name, param.kind) for param in theirs.params]
    if shape != [(param.name, param.kind) for param in ours.params]:
        yield Difference(module, name, "parameters", f"{_shape(theirs)} -> {_shape(ours)}")
        return
    for their_param, our_param in zip(theirs.params, ours.params):
        if their_param.default != our_param.default:
            yield Difference(module, name, "default", f"{their_param.name}: {their_param.default} -> {our_param.default}")
        if their_param.annotation is not None and not _same_type(their_param.annotation, our_param.annotation):
            yield Difference(
                module, name, "annotation", f"{their_param.name}: {their_param.annotation} -> {our_param.annotation}"
            )
    if theirs.returns is not None and not _same_type(theirs.returns, ours.returns):
        yield Difference(module, name, "returns", f"{theirs.returns} -> {ours.returns}")


def _same_type(theirs: str, ours: str | None) -> bool:
    """Equal annotations; a bare generic of vLLM's (`dict`) matches kvref's parameterised one."""
    if ours is None:
        return False
    their_parts, our_parts = theirs.split(" | "), ours.split(" | ")
    return len(their_parts) == len(our_parts) and all(
        mine == other or (other.isidentifier() and mine.startswith(other + "["))
        for other, mine in zip(their_parts, our_parts)
    )


def _shape(member: _Member) -> str:
    return "(" + ", ".join(f"{param.name}:{param.kind}" for param in member.params) + ")"


def differences(vllm_root: Path, checkout: Path = CHECKOUT) -> list[Difference]:
    """Every difference between vLLM's modules under `vllm_root` (an unpacked sdist) and kvref's."""
    found: list[Difference] = []
    ours_everywhere = _read([checkout / path for paths in MODULES.values() for path in paths])
    for vllm_module, kvref_modules in MODULES.items():
        vllm_path = vllm_root / vllm_module
        if not vllm_path.is_file():
            found.append(Difference(vllm_module, "*", "missing", "vLLM has no such module"))
            continue
        theirs, ours = _read([vllm_path]), _read([checkout / path for path in kvref_modules])
        for name, member in sorted(theirs.names.items()):
            if name not in ours.names:
                found.append(Difference(vllm_module, name, "missing", f"{member.kind} {name}"))
                continue
            found.extend(_compare_member(vllm_module, name, member, ours.names[name]))
            if member.kind != "class" or ours.names[name].kind != "class":
                continue
            their_members = _all_members(name, {**ours_everywhere.classes, **theirs.classes})
            our_members = _all_members(name, {**ours_everywhere.classes, **ours.classes})
            for member_name, their_member in sorted(their_members.items()):
                qualified = f"{name}.{member_name}"
                if member_name not in our_members:
                    found.append(Difference(vllm_module, qualified, "missing", f"{their_member.kind} {member_name}"))
                else:
                    found.extend(_compare_member(vllm_module, qualified, their_member, our_members[member_name]))
    return sorted(found)


def documented(doc: Path = DIFFERENCES_DOC) -> dict[tuple[str, str, str], str]:
    """The documented differences: (module, name, kind) -> reason, from the doc's first table."""
    rows: dict[tuple[str, str, str], str] = {}
    in_table = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if cells[0] in ("module", "") or set(cells[0]) <= set("-: "):
            in_table = True
            continue
        module, name, kind, _what, reason = (cells + [""] * 5)[:5]
        rows[(module, name, kind)] = reason
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--vllm", default="0.33.0", help="the vLLM release to compare with (default 0.33.0)")
    parser.add_argument("--all", action="store_true", help="list documented differences too")
    args = parser.parse_args(argv)
    root = fetch_corpus(f"vllm=={args.vllm}", log=False).root
    known = documented()
    found = differences(root)
    undocumented = [difference for difference in found if (difference.module, difference.name, difference.kind) not in known]
    for difference in found:
        reason = known.get((difference.module, difference.name, difference.kind))
        if reason is None or args.all:
            status = "UNDOCUMENTED" if reason is None else f"documented: {reason}"
            print(f"{difference.module}  {difference.name}  [{difference.kind}] {difference.what}  ({status})")
    print(
        f"vLLM {args.vllm}: {len(found)} difference(s) in {len(MODULES)} modules, "
        f"{len(found) - len(undocumented)} documented, {len(undocumented)} undocumented"
    )
    return 1 if undocumented else 0


if __name__ == "__main__":
    raise SystemExit(main())
