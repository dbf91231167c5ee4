"""The request path as a chain of stages over one exchange (``chain.py`` holds the list)."""
