"""`kvref server`: `kvref audit` as a language server (pygls 2, lsprotocol), over stdio.

Diagnostics on open, change (debounced) and save, for the editors' unsaved texts, across files;
quick fixes, `# noqa` and fix-all actions; workspace indexing with progress. The modules:

- `settings`: what the server takes from its command line and the editor;
- `project`: one project's configuration, files and environment, and its findings for the
  editors' texts through the audit's pipeline; `disk_summaries`: its files as on disk;
- `positions`, `diagnostics`, `documents`: findings as the protocol's diagnostics;
- `code_actions`: quick fixes, `# noqa`, fix-all;
- `language_server`, `handlers`: the protocol, threads and timing; `main`: `serve`.

Importing this package needs nothing beyond kvref's core; `serve` needs the `server` extra.
"""

from __future__ import annotations

__all__ = ["MISSING_EXTRA", "server_extra_missing"]

MISSING_EXTRA = "kvref server needs pygls and lsprotocol: pip install 'kvref[server]'"


def server_extra_missing() -> bool:
    """Whether the `server` extra (pygls 2, lsprotocol) cannot be imported."""
    import importlib

    for name in ("pygls.lsp.server", "lsprotocol.types"):
        try:
            importlib.import_module(name)
        except ImportError:
            return True
    return False
