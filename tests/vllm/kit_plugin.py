"""pytest arguments that load the conformance kit's plugin exactly once in a pytester run.

Whether pytest finds the plugin's entry point by itself depends on where it runs (kvref is not
installed in the vLLM environment, but an editable install's kvref.egg-info in the checkout can
announce it), so runs that the tests judge set it aside and name the module instead.
"""

__all__ = ["KIT_PLUGIN", "NO_KIT_PLUGIN"]

NO_KIT_PLUGIN = ("-p", "no:kvref-conformance")
KIT_PLUGIN = (*NO_KIT_PLUGIN, "-p", "kvref.testing.pytest_plugin")
