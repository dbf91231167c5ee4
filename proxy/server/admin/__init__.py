"""The admin API (``/admin/v1``): mounted by ``routes.add_admin_routes``."""
