"""anchorage.operator"""
