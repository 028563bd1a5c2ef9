"""Where the Grafana dashboard and the Prometheus rules live, and the
dashboard's queries as the tests read them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "awa-sql.json"
ALERTS = ROOT / "docs" / "prometheus" / "awa-alerts.yml"


def dashboard_queries(doc: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, template queries included."""
    out = []

    def walk(panels):
        for panel in panels:
            out.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(doc["panels"])
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
            assert match, f"template {var['name']}: unexpected query {query!r}"
            out.append((f"variable {var['name']}", match.group(1)))
    return out
