"""context-proxy: a compacting reverse proxy for the Anthropic Messages API."""

__version__ = "0.1.0"
