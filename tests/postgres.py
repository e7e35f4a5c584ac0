"""A throwaway PostgreSQL server for the tests: its own data folder in a temporary folder, its own port, on loopback
only (127.0.0.1, and a Unix socket in that folder), fsync off; stopped and deleted at the end, whatever happened.

``Server()`` is a context manager (``with Server() as server: server.url``); ``stop()`` and ``start()`` again keep
its data and its port (a database that goes away mid-run and comes back). tests/conftest.py's ``postgres_url`` is
one such server for the session. When none can start here (no binaries, no ``postgres`` user to run it as root,
initdb or the start failing) it raises ``Unavailable`` with the reason on one line, which the fixture turns into a
skip. The binaries: Debian's ``/usr/lib/postgresql/VERSION/bin`` (the newest), else ``initdb`` and ``pg_ctl`` on
PATH. PostgreSQL refuses to run as root: as root, they run as the ``postgres`` system user (Debian's package makes
it) through ``runuser``, in a folder made that user's.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "decisionkit"  # the server's superuser (initdb -U), trusted on loopback: a throwaway server, no password
DATABASE = "decisionkit_test"
INSTALL = "apt-get install postgresql"


class Unavailable(RuntimeError):
    """No PostgreSQL server can start here; the message says why, on one line."""


def binaries() -> Path:
    """The folder holding initdb and pg_ctl, or Unavailable."""
    def version(folder: Path) -> tuple:
        return tuple(int(n) for n in re.findall(r"\d+", folder.parent.name))

    found = sorted((p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")
                    if (p.parent / "pg_ctl").exists()), key=version)
    if found:
        return found[-1]
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb).resolve().parent
    raise Unavailable(f"initdb not found in /usr/lib/postgresql/*/bin or on PATH ({INSTALL})")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


class Server:
    """One throwaway PostgreSQL server (see the module): ``start()``, ``stop()``, ``close()`` (stop and delete);
    ``url`` is the SQLAlchemy URL of its database ``DATABASE``, ``url_of(name)`` another's."""

    def __init__(self, database: str = DATABASE):
        self.database = database
        self.bin = binaries()
        self.runner: list[str] = []
        self.owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self.owner = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable(f"running as root and there is no 'postgres' user to run the server as "
                                  f"({INSTALL} makes it)") from None
            runuser, setpriv = shutil.which("runuser"), shutil.which("setpriv")
            if runuser:
                self.runner = [runuser, "-u", "postgres", "--"]
            elif setpriv:
                self.runner = [setpriv, f"--reuid={self.owner.pw_uid}", f"--regid={self.owner.pw_gid}",
                               "--init-groups", "--"]
            else:
                raise Unavailable("running as root and neither runuser nor setpriv is here to run the server as "
                                  "'postgres'")
        self.root = Path(tempfile.mkdtemp(prefix="decisionkit-postgres-"))  # /tmp: the postgres user reaches it
        if self.owner is not None:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.data, self.socket_dir, self.logfile = self.root / "data", self.root, self.root / "server.log"
        self.port: int | None = None
        self.running = False
        self._initialised = self._created = False
        atexit.register(self.close)  # a session cut short still stops its server

    @property
    def url(self) -> str:
        return self.url_of(self.database)

    def url_of(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str, what: str, timeout: float = 60) -> None:
        try:
            done = subprocess.run([*self.runner, *command], cwd=self.root, capture_output=True, text=True,
                                  timeout=timeout, env={**os.environ, "LC_ALL": "C"})
        except (OSError, subprocess.TimeoutExpired) as err:
            raise Unavailable(f"{what} failed: {type(err).__name__}: {err}") from None
        if done.returncode != 0:
            log = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
            raise Unavailable(f"{what} failed (exit {done.returncode}): {_last_line(done.stderr + done.stdout)}"
                              f"{'; server log: ' + _last_line(log) if log else ''}")

    def start(self) -> Server:
        """Create the cluster (the first time), start it on its port (a free one, the first time), make the
        database; wait until it accepts connections."""
        if self.running:
            return self
        if not self._initialised:
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER, "--no-sync",
                      "-E", "UTF8", "--locale=C", what="initdb")
            self._initialised = True
        ports = [self.port] if self.port is not None else [free_port() for _ in range(3)]  # a restart keeps its port
        for i, port in enumerate(ports):  # a free port may be taken between the probe and the start: another
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {self.socket_dir} -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off")
            try:
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-o", options,
                          "-w", "-t", "60", "start", what="pg_ctl start", timeout=90)
            except Unavailable:
                if i == len(ports) - 1:
                    raise
                continue
            self.port, self.running = port, True
            break
        if not self._created:
            self.create_database(self.database)
            self._created = True
        return self

    def create_database(self, name: str) -> str:
        """A new empty database on this server; its URL."""
        try:
            import psycopg
        except ImportError:
            raise Unavailable("psycopg is not installed (pip install decisionkit-course[postgres])") from None
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True,
                             connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut); its data and port stay for ``start()``."""
        if self.running:
            self.running = False
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "stop", "-m", "fast", "-w", "-t", "60",
                      what="pg_ctl stop", timeout=90)

    def close(self) -> None:
        """Stop the server and delete its folder."""
        try:
            self.stop()
        except Unavailable:
            if self.data.exists():  # pg_ctl stop failed: the postmaster's own pid file names it
                pid = (self.data / "postmaster.pid").read_text().split()[0] if (self.data / "postmaster.pid"
                                                                                ).exists() else ""
                if pid.isdigit():
                    try:
                        os.kill(int(pid), 9)
                    except OSError:
                        pass
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            atexit.unregister(self.close)

    def __enter__(self) -> Server:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
