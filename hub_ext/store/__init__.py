"""The store layer: the service's tables and the database (SQLAlchemy). It imports nothing of the
layers above it (domain, runtime, web).

``from gpupool.hub_ext import store as D`` gives the tables (``D.Workload``), the statuses and ids
of the contract as the tables use them (``D.QUEUED``, ``D.public_id``) and ``D.make_engine`` /
``D.make_sessionmaker``.
"""
from .engine import add_missing_columns, make_engine, make_sessionmaker
from .tables import (ACTIVE, CANCELLED, ENDED, FAILED, JOB, PREEMPTING, QUEUED, RUNNING, STARTING, STATUSES,
                     SUCCEEDED, TRAIN, WORKSPACE, Base, Metric, ReservationRow, Suspension, Workload, parse_public_id,
                     public_id, reservation_rows, reservations_from_rows)

__all__ = ["add_missing_columns", "make_engine", "make_sessionmaker", "ACTIVE", "CANCELLED", "ENDED", "FAILED", "JOB",
           "PREEMPTING", "QUEUED", "RUNNING", "STARTING", "STATUSES", "SUCCEEDED", "TRAIN", "WORKSPACE", "Base", "Metric",
           "ReservationRow", "Suspension", "Workload", "parse_public_id", "public_id", "reservation_rows",
           "reservations_from_rows"]
