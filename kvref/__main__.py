"""`python -m kvref` runs the command line."""

from kvref.cli import main

main()
