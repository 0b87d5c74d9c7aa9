"""The CPU tier: the primary offload medium and the only gateway to GPU memory."""

__all__: list[str] = []
