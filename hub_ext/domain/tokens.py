"""Job tokens: minted by the service at each start of a job (``GPUPOOL_API_TOKEN`` in its
environment); they grant reading that job and posting its metrics. Only the hash is stored, and
the lifecycle clears it when the run ends (domain/lifecycle.py): the token is revoked."""
from __future__ import annotations

import hashlib
import secrets

JOB_TOKEN_PREFIX = "gpj_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint() -> tuple[str, str]:
    """A new job token and its hash (what the job's row keeps)."""
    token = JOB_TOKEN_PREFIX + secrets.token_urlsafe(24)
    return token, hash_token(token)


def is_job_token(token: str) -> bool:
    return token.startswith(JOB_TOKEN_PREFIX)
