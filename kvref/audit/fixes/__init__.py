"""Stage 5, fixes: the edits a finding's fix makes, and applying them to files."""
