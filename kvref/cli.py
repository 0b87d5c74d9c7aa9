"""The `kvref` command line: the typer app is the one definition of every command's options.

`audit_main(argv)` and `demo_main(argv)` run a command as plain functions returning the exit
code; the console script (`main`) parses `kvref audit` with `fast_audit`, which reads the same
typer command's click parameters without typer's per-call value conversion.
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and
# evaluated ones spare it compiling every annotation string each time it builds the command.

import enum
import importlib
import inspect
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    NoReturn,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import typer
import typer.main

from kvref import __version__
from kvref.audit.report import OutputFormat
from kvref.demo_config import DemoConfig

if TYPE_CHECKING:
    from kvref.audit.catalogue import RuleInfo

__all__ = ["app", "audit_main", "demo_main", "fast_audit", "main"]

EXIT_ERROR = 2

app = typer.Typer(
    name="kvref",
    help="A typed KV-cache offload reference, and a checker that keeps class hierarchies honest.",
    no_args_is_help=True,
    add_completion=False,
    # A CI tool must never print a rich traceback with locals: errors exit 2 with one line.
    pretty_exceptions_enable=False,
    # Plain click-style errors and help: a usage error is one "Error: ..." line, not a box.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvref {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """kvref: KV-cache offload reference and `kvref audit`."""


# --- kvref audit / rules / explain: thin wrappers over kvref.audit.command ---


@app.command()
def audit(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Files or directories to report on (default: the current directory); "
            "the whole project is indexed either way. `-` reads one file from stdin "
            "(with --stdin-filename).",
            show_default=False,
        ),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(metavar="CODES", help="Rule codes or prefixes to enable (ALL, KVR0, KVR101); comma-separated, repeatable."),
    ] = None,
    extend_select: Annotated[
        list[str] | None,
        typer.Option(metavar="CODES", help="Rule codes or prefixes to enable on top of the selection; comma-separated, repeatable."),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(metavar="CODES", help="Rule codes or prefixes to disable; comma-separated, repeatable."),
    ] = None,
    extend_ignore: Annotated[
        list[str] | None,
        typer.Option(metavar="CODES", help="Like --ignore (ruff's spelling); the more specific selector wins."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option(help="How findings are printed on stdout.")
    ] = OutputFormat.TEXT,
    statistics: Annotated[
        bool, typer.Option("--statistics", help="Print one line per code with its count instead of the findings.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print the findings only, no summary.")
    ] = False,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when findings remain or files do not parse (usage errors still exit 2).")
    ] = False,
    baseline: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Hide the findings recorded in FILE.")
    ] = None,
    write_baseline: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Record the current findings in FILE and exit.")
    ] = None,
    fix: Annotated[bool, typer.Option("--fix", help="Apply safe fixes.")] = False,
    unsafe_fixes: Annotated[
        bool, typer.Option("--unsafe-fixes", help="Also apply unsafe fixes (annotation rewrites).")
    ] = False,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print the fixes as unified diffs; write nothing.")
    ] = False,
    show_fixes: Annotated[
        bool, typer.Option("--show-fixes", help="List the findings --fix fixed (or would fix), per file.")
    ] = False,
    stdin_filename: Annotated[
        Path | None,
        typer.Option(metavar="PATH", help="The path of the file read from stdin (`-`): audited as that file of its own project (configuration, names), wherever the current directory is; nothing is written."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Read settings from FILE instead of pyproject.toml.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the analysis cache.")
    ] = False,
    cache_dir: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Cache location (default: .kvref_cache in the project root).")
    ] = None,
    python: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Interpreter or venv whose installed packages resolve base classes "
            "(default: $VIRTUAL_ENV, else .venv or venv in the project root, else kvref's own).",
        ),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="Worker processes (default: all CPUs).")
    ] = None,
) -> None:
    """Check @override use and Collection conformance across the project (exit 0 clean, 1 findings, 2 error)."""
    from kvref.audit.command import AuditRequest, run_audit, split_selectors
    from kvref.audit.runner.scale import ScaleSettings

    request = AuditRequest(
        paths=tuple(paths or ()),
        select=split_selectors(select),
        extend_select=split_selectors(extend_select) or (),
        ignore=(*(split_selectors(ignore) or ()), *(split_selectors(extend_ignore) or ())),
        output_format=output_format,
        statistics=statistics,
        quiet=quiet,
        exit_zero=exit_zero,
        baseline=baseline,
        write_baseline=write_baseline,
        fix=fix,
        unsafe_fixes=unsafe_fixes,
        diff=diff,
        show_fixes=show_fixes,
        stdin_filename=stdin_filename,
        config=config,
        scale=ScaleSettings(cache=not no_cache, cache_dir=cache_dir, python=python, jobs=jobs),
    )
    raise typer.Exit(run_audit(request, stdout=sys.stdout, stderr=sys.stderr))


def audit_main(argv: Sequence[str] | None = None) -> int:
    """`kvref audit ARGV` as a plain function: the exit code (help and usage errors included).

    Arguments the fast parse accepts call `audit` directly; anything else (help, a usage
    error) goes through the typer app, which prints what it prints for `kvref audit`.
    """
    args = list(sys.argv[2:] if argv is None else argv)
    try:
        fast_audit(args)
    except typer.Exit as exited:
        return exited.exit_code
    except NotFast:
        pass
    return run_app(["audit", *args])


class DemoDevice(str, enum.Enum):
    """`kvref demo --device`."""

    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


class NotFast(Exception):
    """The fast parse does not take these arguments: typer must parse (and report) them."""


def fast_audit(argv: Sequence[str]) -> NoReturn:
    """Run `kvref audit ARGV` parsed by the click command typer builds from `audit`.

    typer converts every value through pydantic (importing it costs more than a warm audit's
    analysis of a small project); this parse uses the same click parameters, converts by the
    `audit` signature (bool, str, int within `min`/`max`, Path, enums, lists and `None`), and
    calls `audit` itself. The option table is the typer app's: nothing here names an option.

    Raises:
        typer.Exit: from `audit`, with the exit code.
        NotFast: for help, a usage error or a value it does not convert; typer then parses.
    """
    # Only `audit` is built (the app's own registration of it), not every command of the app.
    registered = [info for info in app.registered_commands if info.callback is audit]
    if len(registered) != 1:
        raise NotFast
    alone = typer.Typer(add_completion=False)
    alone.registered_commands.append(registered[0])
    sub = typer.main.get_command(alone)
    try:
        ctx = sub.context_class(sub, info_name="audit")
        opts, extra, _ = sub.make_parser(ctx).parse_args(args=list(argv))
    except Exception:  # noqa: BLE001 - any parse error is typer's to report
        raise NotFast from None
    if extra or any(param.is_eager and opts.get(param.name or "") for param in sub.get_params(ctx)):
        raise NotFast
    signature = inspect.signature(audit)
    hints = get_type_hints(audit, include_extras=True)
    values: dict[str, object] = {}
    for name, parameter in signature.parameters.items():
        raw = opts.get(name)
        values[name] = parameter.default if raw is None or raw == () or raw == [] else _convert(raw, hints[name])
    audit(**values)  # pyright: ignore[reportArgumentType]
    raise AssertionError("audit always raises typer.Exit")


def _convert(raw: object, hint: object) -> object:
    """`raw` (a string, a list of strings or a flag's bool) as the annotation `hint` says."""
    info: object = None
    if get_origin(hint) is Annotated:
        hint, info = get_args(hint)[0], get_args(hint)[1]
    if getattr(info, "callback", None) is not None or getattr(info, "exists", False):
        raise NotFast  # a check this parse does not make
    options = [arg for arg in get_args(hint) if arg is not type(None)]
    if get_origin(hint) in (UnionType, Union) and len(options) == 1:
        hint = options[0]
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        if not isinstance(raw, (list, tuple)):
            raise NotFast
        return [_convert(one, item) for one in cast("Sequence[object]", raw)]
    if hint is bool and isinstance(raw, bool):
        return raw
    if not isinstance(raw, str):
        raise NotFast
    if hint is str:
        return raw
    if hint is Path:
        return Path(raw)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(raw)
        except ValueError:
            raise NotFast from None
    if hint is int:
        if not raw.strip().lstrip("+-").isdigit():
            raise NotFast
        number = int(raw)
        low, high = getattr(info, "min", None), getattr(info, "max", None)
        if (isinstance(low, int) and number < low) or (isinstance(high, int) and number > high):
            raise NotFast
        return number
    raise NotFast


def _catalogue_or_exit() -> "tuple[RuleInfo, ...]":
    try:
        # The rules (and the engine parts they use) load only for the commands that list them.
        from kvref.audit.rules import rule_catalogue

        return rule_catalogue()
    except Exception as exc:  # noqa: BLE001 - exit 2 with one line, never a traceback
        sys.stderr.write(f"kvref: internal error: cannot load the rules: {type(exc).__name__}: {exc}\n")
        raise typer.Exit(2) from None


@app.command()
def rules() -> None:
    """List the audit rules: code, name, on/off by default, fixable, summary."""
    from kvref.audit.report.rules import list_rules

    raise typer.Exit(list_rules(_catalogue_or_exit(), sys.stdout))


@app.command()
def explain(
    code: Annotated[str, typer.Argument(help="A rule code (KVR001) or name (missing-override).")],
) -> None:
    """Print one audit rule's documentation."""
    from kvref.audit.report.rules import explain_rule

    raise typer.Exit(explain_rule(_catalogue_or_exit(), code, sys.stdout, sys.stderr))


# --- kvref server: the audit over the Language Server Protocol (kvref.server) ---


@app.command()
def server(
    python: Annotated[
        Path | None,
        typer.Option(help="The interpreter (or virtual environment) whose packages resolve bases, as for `kvref audit`."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A TOML file instead of the nearest pyproject.toml.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the summary cache `kvref audit` uses.")
    ] = False,
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Accepted for editors that pass it: stdin/stdout is the only transport.")
    ] = False,
) -> None:
    """Start the language server on stdin/stdout: the audit's diagnostics and fixes in an editor."""
    del stdio  # stdio is what the server speaks either way
    from kvref.server import MISSING_EXTRA, server_extra_missing

    if server_extra_missing():
        sys.stderr.write(f"kvref: error: {MISSING_EXTRA}\n")
        raise typer.Exit(EXIT_ERROR)
    from kvref.server.main import serve
    from kvref.server.settings import ServerSettings

    serve(ServerSettings(python=python, configuration=config, cache=not no_cache))


# --- demo (transfer area) ---

@app.command("demo")
def demo(
    layers: Annotated[int, typer.Option(help="Transformer layers, split between two KV groups.")] = DemoConfig.layers,
    block_tokens: Annotated[int, typer.Option(help="Tokens per GPU block.")] = DemoConfig.block_tokens,
    block_size_factor: Annotated[int, typer.Option(help="GPU blocks per offloaded block.")] = DemoConfig.block_size_factor,
    gpu_blocks: Annotated[int, typer.Option(help="GPU blocks per KV tensor.")] = DemoConfig.num_gpu_blocks,
    cpu_blocks: Annotated[int, typer.Option(help="CPU (offloaded) blocks.")] = DemoConfig.num_cpu_blocks,
    requests: Annotated[int, typer.Option(help="Requests served.")] = DemoConfig.requests,
    documents: Annotated[int, typer.Option(help="Shared prompt prefixes.")] = DemoConfig.documents,
    doc_blocks: Annotated[int, typer.Option(help="Offloaded blocks per document prefix.")] = DemoConfig.doc_blocks,
    suffix_blocks: Annotated[int, typer.Option(help="Offloaded blocks of each request's own suffix.")] = DemoConfig.suffix_blocks,
    device: Annotated[
        DemoDevice, typer.Option(help="Where the KV cache lives (auto: CUDA when available).")
    ] = DemoDevice(DemoConfig.device),
    seed: Annotated[int, typer.Option(help="The script's random seed.")] = DemoConfig.seed,
    no_tiering: Annotated[
        bool, typer.Option("--no-tiering", help="Skip the tiering phase (CPU primary + filesystem tier).")
    ] = False,
) -> None:
    """Run the end-to-end offload demo: offload, evict, reload into other GPU blocks, verify."""
    _require_torch()
    # Imported here: kvref.demo loads the offloading library (and torch when it runs).
    from kvref.demo import run_config

    config = DemoConfig(
        layers=layers,
        block_tokens=block_tokens,
        block_size_factor=block_size_factor,
        num_gpu_blocks=gpu_blocks,
        num_cpu_blocks=cpu_blocks,
        requests=requests,
        documents=documents,
        doc_blocks=doc_blocks,
        suffix_blocks=suffix_blocks,
        device=device.value,
        seed=seed,
        tiering=not no_tiering,
    )
    raise typer.Exit(run_config(config))


def _require_torch() -> None:
    """Exit 2 with one line when torch (the `kvref[torch]` extra) cannot be imported: it is
    not installed, or it is and its import fails (a missing CUDA library is an `OSError`, a
    build for other libraries an `ImportError`, a missing dependency of torch's a
    `ModuleNotFoundError` naming that dependency)."""
    try:
        with warnings.catch_warnings():
            # CPU wheels of torch warn on import when numpy is absent; kvref never uses numpy.
            warnings.filterwarnings("ignore", message=".*NumPy.*")
            importlib.import_module("torch")
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] == "torch":
            sys.stderr.write("kvref: error: `kvref demo` needs torch: pip install 'kvref[torch]'\n")
            raise typer.Exit(EXIT_ERROR) from None
        _torch_fails_to_import(missing)
    except Exception as error:  # noqa: BLE001 - whatever torch's import raises is one line
        _torch_fails_to_import(error)


def _torch_fails_to_import(error: Exception) -> NoReturn:
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    sys.stderr.write(
        "kvref: error: `kvref demo` needs torch, which is installed but fails to import: "
        f"{type(error).__name__}: {text}\n"
    )
    raise typer.Exit(EXIT_ERROR) from None


def demo_main(argv: Sequence[str]) -> int:
    """`kvref demo ARGV` as a plain function: the exit code (help and usage errors included)."""
    return run_app(["demo", *argv])


def main() -> None:
    """Run the command line on `sys.argv` (the console script, `python -m kvref`)."""
    argv = sys.argv[1:]
    if argv[:1] == ["audit"]:
        raise SystemExit(audit_main(argv[1:]))
    raise SystemExit(run_app(argv))


def run_app(argv: Sequence[str]) -> int:
    """Run the typer app on `argv` and return its exit code.

    A usage error (an unknown option, a bad value) is one line on stderr and exit 2, like every
    other kvref error, instead of click's usage block.
    """
    if not argv:
        # Bare `kvref`: the help, with the usage-error status click gives it.
        run_app(["--help"])
        return EXIT_ERROR
    try:
        result = app(list(argv), prog_name="kvref", standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("kvref: aborted\n")
        return 1
    except Exception as error:
        # click's UsageError: typer re-exports only its BadParameter subclass, and which click
        # (installed or vendored) depends on typer's version, so it is recognised by its shape.
        describe = getattr(error, "format_message", None)
        if getattr(error, "exit_code", None) != EXIT_ERROR or not callable(describe):
            raise
        context = getattr(error, "ctx", None)
        command = getattr(context, "command_path", None) or "kvref"
        sys.stderr.write(f"{command}: error: {describe()} (see `{command} --help`)\n")
        return EXIT_ERROR
    return result if isinstance(result, int) else 0
