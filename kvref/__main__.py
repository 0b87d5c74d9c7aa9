"""`python -m kvref` runs the command line."""

from kvref.cli import app

app()
