"""The SQL that ships with this package: numbered migrations and the function layer."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

CHECKSUM_ALGORITHM = "sha256"
MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
NO_TRANSACTION_MARK = "-- awa:no-transaction"
LAYER_MANIFEST = "manifest.txt"


class SourceError(RuntimeError):
    """The packaged SQL is malformed (a packaging bug, not a database problem)."""


def _packaged_dir(name: str) -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise SourceError(f"cannot find the {name}/ folder next to {here}")


def migrations_dir() -> Path:
    return _packaged_dir("migrations")


def layer_dir() -> Path:
    return _packaged_dir("sql")


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str
    checksum: str
    transactional: bool

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class LayerFile:
    name: str
    text: str
    checksum: str


def load_migrations(folder: Path | None = None) -> list[Migration]:
    folder = folder or migrations_dir()
    found: dict[int, Migration] = {}
    for path in sorted(folder.glob("*.sql")):
        match = MIGRATION_NAME.match(path.name)
        if not match:
            raise SourceError(f"{path.name}: migration files are named NNNN_description.sql")
        version = int(match.group(1))
        if version in found:
            raise SourceError(f"{path.name}: version {version:04d} is used twice")
        data = path.read_bytes()
        text = data.decode("utf-8")
        header = text.split("\n", 20)[:20]
        found[version] = Migration(
            version=version,
            name=match.group(2),
            text=text,
            checksum=checksum(data),
            transactional=not any(line.strip() == NO_TRANSACTION_MARK for line in header),
        )
    versions = sorted(found)
    if versions != list(range(1, len(versions) + 1)):
        raise SourceError(f"migration versions must run 1, 2, 3, ... without gaps: {versions}")
    return [found[v] for v in versions]


def load_layer(folder: Path | None = None) -> list[LayerFile]:
    """The function-layer files in the order ``sql/manifest.txt`` gives."""
    folder = folder or layer_dir()
    manifest = folder / LAYER_MANIFEST
    names = [
        line.strip()
        for line in manifest.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    on_disk = {p.name for p in folder.glob("*.sql")}
    if missing := [n for n in names if n not in on_disk]:
        raise SourceError(f"{LAYER_MANIFEST} lists files that do not exist: {missing}")
    if unlisted := sorted(on_disk - set(names)):
        raise SourceError(f"sql files missing from {LAYER_MANIFEST}: {unlisted}")
    files = []
    for name in names:
        data = (folder / name).read_bytes()
        files.append(LayerFile(name=name, text=data.decode("utf-8"), checksum=checksum(data)))
    return files
