"""Group commit of submissions (the API's ``POST jobs``)."""
from __future__ import annotations

import asyncio
import logging

from sqlalchemy import insert

from .tables import Workload

log = logging.getLogger("gpupool")


class Refused(Exception):
    """The database refused a row (the API answers 503 with the message)."""


class BatchInserter:
    """Group commit for submissions: the inserts of requests that arrive within a millisecond share
    one transaction (one SQLite commit), and each request gets its id once that commit is done.

    Requests are validated fully before they get here. Should the database still refuse a batch,
    its rows are inserted one by one, so that only the request at fault fails (with its own answer)."""

    def __init__(self, engine: Any, delay: float = 0.001):
        self.engine = engine
        self.delay = delay
        self.table = Workload.__table__
        self.pending: list[tuple[dict, asyncio.Future]] = []

    def insert(self, values: dict) -> "asyncio.Future[int]":
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((values, fut))
        if len(self.pending) == 1:
            loop.call_later(self.delay, self._flush)
        return fut

    def _insert(self, rows: list[dict]) -> list[int]:
        with self.engine.begin() as conn:
            stmt = insert(self.table).returning(self.table.c.id, sort_by_parameter_order=True)
            return [r[0] for r in conn.execute(stmt, rows)]

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        try:
            ids = self._insert([v for v, _ in batch])
        except Exception:  # nothing of the batch was committed: one by one, each gets its own answer
            if len(batch) > 1:
                log.warning("a batch of %d submissions was refused; storing them one by one", len(batch))
            for values, fut in batch:
                try:
                    (new_id,) = self._insert([values])
                except Exception as e:
                    log.exception("could not store a submission of %s", values.get("user"))
                    if not fut.done():
                        fut.set_exception(Refused(f"the gpupool database refused the job: {type(e).__name__}"))
                else:
                    if not fut.done():
                        fut.set_result(new_id)
            return
        for (_, fut), new_id in zip(batch, ids):
            if not fut.done():
                fut.set_result(new_id)
