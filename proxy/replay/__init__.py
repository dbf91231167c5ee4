"""Offline replay: what the proxy would do to a recorded conversation, turn by turn."""
