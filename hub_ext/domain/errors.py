"""The one error a rule of the service raises for a request it refuses: an HTTP status (4xx, or
503 when the database refused), a message that starts with the field at fault, and the field.
The web layer turns it into the error payload of gpupool/contract.py."""
from __future__ import annotations


class APIError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
