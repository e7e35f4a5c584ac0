"""The decision log's tables, in a SQLite file or any database SQLAlchemy reaches.

``open_store(where)``: ``where`` is a path (a SQLite file, created with mode 600 and put in WAL mode, so readers never
block the server's writes and a killed server loses no committed batch) or a database URL
(``postgresql+psycopg://user@host/db``, ``sqlite:///path``): several servers may share one. The tables are
decisionkit's own, named ``decisionkit_*``, beside whatever else the database holds, which is never touched:

- ``decisionkit_meta``      the schema version (``SCHEMA_VERSION``); a log of another version is refused, not altered
- ``decisionkit_decisions`` one row per answered request: time, model name, version and folder, request id,
                            workflow, state, questions, answers, routing verdict, reason and scores, latency
- ``decisionkit_reviews``   the review queue: one row per case (a hash of its workflow, state and questions), why it is
                            queued (``routed`` to a human, or ``audit``), the model's answers and scores
- ``decisionkit_answers``   what people answered, append-only: review, reviewer, time, verb, labels

A path that holds a file which is not a decisionkit log (a SQLite file of other tables, or not SQLite at all) is
refused with one line; so is a database that cannot be reached.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from ..core import errors
from ..core.errors import UserError

SCHEMA_VERSION = 1  # bump when a table changes; an older log is then refused with a line saying so
PREFIX = "decisionkit_"

metadata = sa.MetaData()
meta = sa.Table(f"{PREFIX}meta", metadata,
                sa.Column("key", sa.String(64), primary_key=True),
                sa.Column("value", sa.String(256), nullable=False))


def _answered() -> list[sa.Column]:
    """The columns a decision and its queued case share: who answered what, and how the router saw it."""
    return [sa.Column("request_id", sa.String(128), nullable=False, index=True),
            sa.Column("model", sa.String(256), nullable=False),
            sa.Column("version", sa.String(64)),
            sa.Column("folder", sa.Text),
            sa.Column("workflow", sa.String(256)),
            sa.Column("state", sa.JSON, nullable=False),
            sa.Column("questions", sa.JSON, nullable=False),
            sa.Column("answers", sa.JSON, nullable=False),
            sa.Column("verdict", sa.String(16)),
            sa.Column("reason", sa.Text),
            sa.Column("scores", sa.JSON)]


decisions = sa.Table(f"{PREFIX}decisions", metadata,
                     sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                     sa.Column("at", sa.Float, nullable=False, index=True),  # seconds since the epoch, UTC
                     sa.Column("case_key", sa.String(32), nullable=False, index=True),
                     *_answered(),
                     sa.Column("latency_ms", sa.Float))
reviews = sa.Table(f"{PREFIX}reviews", metadata,
                   sa.Column("id", sa.String(32), primary_key=True),  # the case key
                   sa.Column("at", sa.Float, nullable=False),
                   sa.Column("why", sa.String(16), nullable=False),  # routed | audit
                   *_answered(),
                   sa.Column("confidence", sa.Float))  # the lowest confidence of its answers: the queue's order
answers = sa.Table(f"{PREFIX}answers", metadata,
                   sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                   sa.Column("review_id", sa.String(32), sa.ForeignKey(reviews.c.id), nullable=False, index=True),
                   sa.Column("at", sa.Float, nullable=False),
                   sa.Column("reviewer", sa.String(256), nullable=False),
                   sa.Column("verb", sa.String(16), nullable=False),  # accept | correct | not-a-case
                   sa.Column("labels", sa.JSON, nullable=False))  # question -> option key ({} for not-a-case)
TABLES = [t.name for t in metadata.sorted_tables]


class LogError(UserError, ValueError):
    """A decision log that cannot be opened or is not one: the message says which and why, on one line."""


@dataclass(frozen=True)
class Store:
    """An open decision log: its engine and how to name it in messages (a path, or the URL without its password)."""

    engine: sa.Engine
    shown: str


def url_of(where: str | Path) -> tuple[str, str, Path | None]:
    """(SQLAlchemy URL, how to show it, the SQLite file or None) for a path or a URL."""
    text = str(where)
    if "://" in text:
        url = sa.make_url(text)
        file = Path(url.database).expanduser().absolute() if url.get_backend_name() == "sqlite" and url.database \
            and url.database != ":memory:" else None
        return text, url.render_as_string(hide_password=True), file
    file = Path(text).expanduser().absolute()
    return f"sqlite:///{file}", str(where), file


def _sqlite_file(file: Path, shown: str) -> None:
    """Create the SQLite file with mode 600 (answers and states are the user's data); an existing file must be a
    SQLite database."""
    if file.is_dir():
        raise LogError(f"decision log {shown}: is a folder; give a file path (a SQLite file) or a database URL")
    if not file.exists():
        if not file.parent.is_dir():
            raise LogError(f"decision log {shown}: its folder {file.parent} does not exist")
        os.close(os.open(file, os.O_CREAT | os.O_WRONLY, 0o600))
        return
    with open(file, "rb") as handle:
        head = handle.read(16)
    if head and head != b"SQLite format 3\x00":
        raise LogError(f"decision log {shown}: is not a SQLite file (it begins {head[:8]!r}); give a new path or a "
                       "decisionkit log")


def _on_connect(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")  # a committed batch survives a killed process (not a power cut)
    cursor.execute("PRAGMA busy_timeout=5000")  # a write that waits longer fails, is counted and retried
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_store(where: str | Path, create: bool = True) -> Store:
    """The decision log at ``where`` (a path or a URL), its tables checked (their schema version) or, with
    ``create`` and none of them there, made. A LogError says in one line why it cannot be used."""
    url, shown, file = url_of(where)
    if file is not None:
        if not create and not file.is_file():
            raise LogError(f"decision log {shown}: not found")
        _sqlite_file(file, shown)
    try:
        engine = sa.create_engine(url, pool_pre_ping=True)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as err:
        raise LogError(f"decision log {shown}: cannot be opened ({type(err).__name__}: {err}); give a SQLite path "
                       "or a URL such as postgresql+psycopg://user@localhost/db (pip install decisionkit-course"
                       "[postgres])") from None
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _on_connect)
    try:
        with engine.begin() as conn:
            _check(conn, shown, create)
        if engine.dialect.name == "sqlite":  # after the check: WAL rewrites the header of a file that is refused
            with engine.connect() as conn:  # persistent in the file: readers (the review page) never block the writer
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    except LogError:
        engine.dispose()  # a log refused keeps no connection open
        raise
    except sa.exc.SQLAlchemyError as err:
        engine.dispose()
        raise LogError(f"decision log {shown}: cannot be opened ({one_line(err)})") from None
    return Store(engine, shown)


def one_line(err: BaseException) -> str:
    """A database error as ``errors.one_line`` of the driver's own error (SQLAlchemy wraps it), at most 320 chars."""
    return errors.one_line(getattr(err, "orig", None) or err)[:320]


def _check(conn, shown: str, create: bool) -> None:
    found = set(sa.inspect(conn).get_table_names())
    ours = found & set(TABLES)
    if not ours:
        if found and not create:
            raise LogError(f"decision log {shown}: holds other tables and no decisionkit log")
        if not create:
            raise LogError(f"decision log {shown}: holds no decisionkit log")
        if found and conn.dialect.name == "sqlite":
            raise LogError(f"decision log {shown}: is a SQLite file of other tables ({', '.join(sorted(found)[:5])});"
                           " give a new path: decisionkit does not write into a file it did not make")
        metadata.create_all(conn)
        conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
        return
    if f"{PREFIX}meta" not in ours:
        raise LogError(f"decision log {shown}: has tables named {PREFIX}* but no {PREFIX}meta; not a log this "
                       "decisionkit wrote")
    version = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    if version != str(SCHEMA_VERSION):
        raise LogError(f"decision log {shown}: schema version {version}; this decisionkit reads version "
                       f"{SCHEMA_VERSION} (keep the file, and log to a new one)")
    missing = set(TABLES) - ours
    if missing:
        raise LogError(f"decision log {shown}: tables {sorted(missing)} are missing; the log is damaged")
