"""Stage 2, parse and summarise: each file becomes a picklable `ModuleSummary`."""
