"""Test-wide settings: bounded hypothesis runs so `make test` stays fast on 2 cores."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("KVREF_HYPOTHESIS_PROFILE", "default"))
