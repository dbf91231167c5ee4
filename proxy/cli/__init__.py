"""The ``context-proxy`` command line."""
