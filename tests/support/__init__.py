"""Helpers that start real services on loopback for tests (session-scoped fixtures use them)."""
