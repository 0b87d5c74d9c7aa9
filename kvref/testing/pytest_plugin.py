"""pytest plugin of the conformance kit: the `--kvref-conformance=quick|deep` option.

Registered as a `pytest11` entry point, so pytest loads it wherever kvref is installed; it
imports nothing but pytest. `quick` (the default) keeps each contract class within a minute on
two cores; `deep` runs the kit's random programs many times longer (Hypothesis examples and
steps), for a tier or manager about to be submitted, or a nightly job.
"""

from __future__ import annotations

import pytest

__all__ = ["OPTION", "DEPTHS", "pytest_addoption"]

OPTION = "kvref_conformance"
DEPTHS = ("quick", "deep")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("kvref").addoption(
        "--kvref-conformance",
        dest=OPTION,
        choices=DEPTHS,
        default="quick",
        help="how hard kvref.testing.vllm's contracts search for broken promises (default: quick)",
    )
