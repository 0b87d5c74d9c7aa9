"""Cache policies of the CPU tier (LRU, ARC) behind one `CachePolicy` ABC."""

__all__: list[str] = []
