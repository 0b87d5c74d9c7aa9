"""The `kvref` console script and `python -m kvref` (the command line is `kvref.cli`)."""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Run the command line on `sys.argv` (exits with the command's status)."""
    from kvref.cli import main as cli_main

    cli_main()
