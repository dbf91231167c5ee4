"""The operator console at ``/console/``: read-only pages over the admin API (see routes.py)."""
