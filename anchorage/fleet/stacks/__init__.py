"""Peer stacks and Anchorage's, one module per vendor (``anchorage.fleet.spec``)."""
