"""The built-in demo provider: try the proxy without an API key."""
