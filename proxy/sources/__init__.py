"""Sources behind durable context: resolving source pointers, and writing the files they name.

``resolver`` verifies pointers against a tenant's trusted roots (``policy``) following the on-disk
``layout``; ``transcript_files`` and ``artifact_files`` write that layout. The pointer grammar
itself is pure and lives in :mod:`proxy.core.pointers`.
"""
