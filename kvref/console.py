"""The `kvref` console script and `python -m kvref`: `kvref audit` without loading typer.

`kvref audit ARGS` that argparse accepts goes straight to `kvref.audit.command`, which the typer
command wraps anyway: typer builds a pydantic adapter for every option of every call (about
0.2 s, a seventh of a warm audit of a large project, paid again by every pre-commit run), and
importing it takes 0.03 s more. Help, usage errors and every other command go through the
typer app in `kvref.cli`, so what the user reads is the same either way.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Run the command line on `sys.argv` (exits with the command's status)."""
    argv = sys.argv[1:]
    if argv[:1] == ["audit"]:
        from kvref.audit.command import request_from_argv, run_audit

        request = request_from_argv(argv[1:])
        if request is not None:
            raise SystemExit(run_audit(request, stdout=sys.stdout, stderr=sys.stderr))
    from kvref.cli import app

    app()
