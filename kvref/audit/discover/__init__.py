"""Stage 1, discover: the project root, its configuration, its files and its Python environment."""
