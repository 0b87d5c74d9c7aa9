"""Stage 3, resolve bases: the project index and every class's resolved ancestry."""
