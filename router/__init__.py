"""anchorage.router"""
