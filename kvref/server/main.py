"""`serve`: run the language server on stdin/stdout until the client says `exit`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from kvref.server.handlers import create_server
from kvref.server.settings import ServerSettings

__all__ = ["serve"]


def serve(settings: ServerSettings, cwd: Path | None = None) -> None:
    """Serve the protocol over stdio; stdout is the protocol, logging goes to stderr."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    server = create_server(settings, cwd or Path.cwd())
    server.start_io()
