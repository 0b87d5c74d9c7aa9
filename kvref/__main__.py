"""`python -m kvref` runs the command line."""

from kvref.console import main

main()
