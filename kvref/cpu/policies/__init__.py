"""Cache policies of the CPU tier (LRU, ARC) behind one `CachePolicy` ABC, resolved by name by
`CachePolicyFactory`."""
