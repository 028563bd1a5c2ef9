"""The package version, which the installed SQL contract carries too
(``awa.contract_version()``). A module of its own so that every other module
can import it without importing the client through ``awa_sql/__init__.py``."""

__version__ = "0.1.0"
