"""The database: an engine with every table of the service (tables.py, ledger.py, samples.py, nodes.py).

SQLAlchemy 2; SQLite by default (WAL journal, ``synchronous=NORMAL``: a committed row survives the
service being killed at any moment). Any SQLAlchemy URL works (``c.GPUPool.db_url``).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from . import ledger, nodes, samples  # noqa: F401 (their tables are part of the schema)
from .tables import Base


def make_engine(url: str) -> Engine:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    Base.metadata.create_all(engine)
    add_missing_columns(engine)
    return engine


def add_missing_columns(engine: Engine) -> None:
    """Columns added to a table since its database was created (``create_all`` makes only missing
    tables): ``ALTER TABLE ... ADD COLUMN`` with the column's default, so a service upgraded in
    place keeps its jobs."""
    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name in have:
                continue
            kind = col.type.compile(dialect=engine.dialect)
            default = col.default.arg if col.default is not None and not callable(col.default.arg) else None
            clause = f" DEFAULT {int(default) if isinstance(default, bool) else default!r}" if isinstance(
                default, (int, float, bool)) else ""
            with engine.begin() as conn:
                conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}{clause}'))


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
