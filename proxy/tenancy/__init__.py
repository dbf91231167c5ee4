"""Tenancy: tenant policies (keys, upstream credentials, sources, quota) and how they are loaded."""
