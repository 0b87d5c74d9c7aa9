"""The `kvref` command line (a thin typer layer over plain `main(argv) -> int` functions)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvref import __version__
from kvref.audit.report import OutputFormat

if TYPE_CHECKING:
    from kvref.audit.catalogue import RuleInfo

__all__ = ["app", "main"]

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
            "the whole project is indexed either way.",
            show_default=False,
        ),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(help="Rule codes or prefixes to enable (ALL, KVR0, KVR101); comma-separated, repeatable."),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(help="Rule codes or prefixes to disable; comma-separated, repeatable."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option(help="How findings are printed on stdout.")
    ] = OutputFormat.TEXT,
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
        ignore=split_selectors(ignore) or (),
        output_format=output_format,
        exit_zero=exit_zero,
        baseline=baseline,
        write_baseline=write_baseline,
        fix=fix,
        unsafe_fixes=unsafe_fixes,
        diff=diff,
        config=config,
        scale=ScaleSettings(cache=not no_cache, cache_dir=cache_dir, python=python, jobs=jobs),
    )
    raise typer.Exit(run_audit(request, stdout=sys.stdout, stderr=sys.stderr))


def _catalogue_or_exit() -> tuple[RuleInfo, ...]:
    from kvref.audit.catalogue import load_rule_catalogue

    try:
        return load_rule_catalogue()
    except Exception as exc:  # noqa: BLE001 - exit 2 with one line, never a traceback
        sys.stderr.write(f"kvref: internal error: cannot load the rules: {type(exc).__name__}: {exc}\n")
        raise typer.Exit(2) from None


@app.command()
def rules() -> None:
    """List the audit rules: code, name, on/off by default, fixable, summary."""
    from kvref.audit.command import list_rules

    raise typer.Exit(list_rules(_catalogue_or_exit(), sys.stdout))


@app.command()
def explain(
    code: Annotated[str, typer.Argument(help="A rule code (KVR001) or name (missing-override).")],
) -> None:
    """Print one audit rule's documentation."""
    from kvref.audit.command import explain_rule

    raise typer.Exit(explain_rule(_catalogue_or_exit(), code, sys.stdout, sys.stderr))


# --- demo (transfer area) ---


@app.command(
    "demo",
    # Options are parsed by kvref.demo's own argparse parser (`kvref demo --help`).
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def _demo(ctx: typer.Context) -> None:
    """Run the end-to-end offload demo: offload, evict, reload into other GPU blocks, verify."""
    # Imported here: the demo's own module loads torch only when it runs, so `--help`
    # works without torch; running it without torch is one line and exit 2.
    from kvref.demo import main as demo_main

    if not {"-h", "--help"} & set(ctx.args):
        try:
            importlib.import_module("torch")
        except ModuleNotFoundError as missing:
            if (missing.name or "").partition(".")[0] != "torch":
                raise
            sys.stderr.write("kvref: error: `kvref demo` needs torch: pip install 'kvref[torch]'\n")
            raise typer.Exit(2) from None
    raise typer.Exit(demo_main(ctx.args))


def main() -> None:
    """The console script's entry point (`kvref.console.main`; kept here for callers)."""
    from kvref.console import main as console_main

    console_main()
