"""The admin HTTP API and web page (``awa admin serve``).

``create_app`` builds the ASGI app; ``serve.create_served_app`` adds the
database metrics at ``/metrics`` and ``serve`` runs that under uvicorn. Reads go
through the views granted to awa_reader; writes call the awa_operator
functions and pass one guard first (``guard.require_write``).
"""

from awa_sql.admin.app import Settings, create_app

__all__ = ["Settings", "create_app"]
