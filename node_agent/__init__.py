"""anchorage.node_agent"""
