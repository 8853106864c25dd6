"""The whole Anchorage stack on one machine (`anchorage up`, `anchorage demo`): process
orchestration for the router (local Ray), vLLM engines, node-agent sidecars and Prometheus,
all on loopback. One module per concern; `stack.py` puts them together."""
