"""The six roles of the awa contract and the names they have in one database."""

from __future__ import annotations

from dataclasses import asdict, dataclass

CAPABILITIES = ("owner", "producer", "worker", "maintenance", "operator", "reader")
RUNTIME_CAPABILITIES = CAPABILITIES[1:]

# What each role may do, for docs, `awa status` and error messages.
DESCRIPTIONS = {
    "owner": "owns schema awa and every object in it (NOLOGIN; never granted to applications)",
    "producer": "enqueue: single, batch, COPY",
    "worker": "claim, heartbeat, complete, fail; read a run's outcome",
    "maintenance": "the maintenance passes: promote scheduled jobs, rescue expired leases, the "
                   "auto-scaler tick, retention, rewrites",
    "operator": "change enqueue shards, shard mode, pause and resume, the queue policies, "
                "the queue limit, stripes and partitions; the job tools; read everything",
    "reader": "read-only views and stats for dashboards and the admin page",
}


@dataclass(frozen=True)
class Roles:
    """Role names by capability. Defaults are ``awa_<capability>``."""

    owner: str = "awa_owner"
    producer: str = "awa_producer"
    worker: str = "awa_worker"
    maintenance: str = "awa_maintenance"
    operator: str = "awa_operator"
    reader: str = "awa_reader"

    @classmethod
    def with_prefix(cls, prefix: str, **overrides: str | None) -> Roles:
        names = {cap: f"{prefix}{cap}" for cap in CAPABILITIES}
        names.update({cap: name for cap, name in overrides.items() if name})
        roles = cls(**names)
        roles.validate()
        return roles

    def validate(self) -> None:
        names = list(self.as_dict().values())
        for cap, name in self.as_dict().items():
            if not name or len(name.encode()) > 63:
                raise ValueError(
                    f"role name for {cap} must be 1 to 63 bytes, got {name!r}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"role names must be distinct, got {names}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def runtime(self) -> dict[str, str]:
        return {cap: getattr(self, cap) for cap in RUNTIME_CAPABILITIES}
