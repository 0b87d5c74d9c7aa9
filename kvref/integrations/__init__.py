"""kvref's parts inside other engines, through their own plug-in points.

`kvref.integrations.vllm`: kvref's Redis and filesystem tiers as vLLM 0.33 secondary tiers. Each
integration imports its engine and is imported only on demand: nothing else in kvref imports
one, so kvref never needs an engine installed.
"""

__all__: list[str] = []
