"""Test kits that hold other people's code to a contract.

`kvref.testing.vllm`: pytest base classes that check a vLLM secondary tier or offloading manager
against the promises vLLM 0.33's scheduler relies on (docs/CONFORMANCE.md). It needs vLLM,
pytest and Hypothesis (`pip install 'kvref[vllm-conformance]'`); `kvref.testing.pytest_plugin`
adds its `--kvref-conformance` option and needs neither vLLM nor anything else.
"""

__all__: list[str] = []
