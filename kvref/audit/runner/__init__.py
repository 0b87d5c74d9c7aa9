"""Around the pipeline: the result and summary caches, worker processes, progress."""
