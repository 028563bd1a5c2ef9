"""awa-sql: a PostgreSQL job-queue storage contract that lives in schema ``awa``.

The Python package installs and upgrades the SQL (``awa_sql.migrate``) and
carries the operator surfaces (the ``awa`` CLI).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
