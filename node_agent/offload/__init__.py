"""Anchorage's host-memory KV tier inside vLLM 0.32, through vLLM's own offloading seams:
``OffloadingConnector`` (``AnchorageOffloadingConnector``, ``connector``), an out-of-tree
``OffloadingSpec`` with a CPU transfer worker (``spec``, ``worker``) and the host-tier
``CachePolicy`` (``policy``). See docs/tiering.md, "The host tier in the engine"."""
