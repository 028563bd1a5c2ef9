"""Old name of ``awa_sql.shards``: admin/routes.py still imports it from
here (another branch edits that file). Remove once it imports awa_sql.shards."""

from awa_sql.shards import ordering_consequence, plan_enqueue_shards, set_enqueue_shards

__all__ = ["ordering_consequence", "plan_enqueue_shards", "set_enqueue_shards"]
