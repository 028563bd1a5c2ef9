"""Metrics: the Python client's own (``client_metrics``) and the database
exporter (``database``, served by ``apps``).

For a web app: ``make_asgi_app(dsn)`` or ``make_wsgi_app(dsn)``, mounted at
``/metrics``; for anything else ``render(conn) -> (body, content_type)``.
"""

from awa_sql.metrics.apps import database_registry, make_asgi_app, make_wsgi_app
from awa_sql.metrics.client_metrics import ClientMetrics, use_registry
from awa_sql.metrics.database import DatabaseCollector, render

__all__ = [
    "ClientMetrics",
    "DatabaseCollector",
    "database_registry",
    "make_asgi_app",
    "make_wsgi_app",
    "render",
    "use_registry",
]
