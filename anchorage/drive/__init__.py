"""`anchorage drive`: replay a multi-agent workload against an OpenAI-compatible endpoint
(the Anchorage router) as real HTTP traffic, and report what the caches did."""
