"""Request and answer models of model endpoints (``kind: inference``; docs/endpoints.md).

:class:`EndpointChoice` gives ``POST jobs`` its ``replicas`` and ``share``; :class:`EndpointOut`
gives the job answer its ``endpoint`` (the URL path through the hub), ``endpoint_state`` and the
readiness probe's findings. schemas.py mixes them in (this module keeps it within the module size
the layers allow)."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ... import contract as C

ShareName = Annotated[str, Field(strict=True, min_length=1, max_length=C.MAX_NAME)]


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


class Share(BaseModel):
    """Who else may call an endpoint (its owner always may)."""

    model_config = ConfigDict(extra="forbid")

    users: Annotated[list[ShareName], Field(max_length=C.MAX_SHARES)] = Field(
        [], description="JupyterHub users who may call it")
    groups: Annotated[list[ShareName], Field(max_length=C.MAX_SHARES)] = Field(
        [], description="JupyterHub groups whose members may call it")


class EndpointChoice(BaseModel):
    replicas: Optional[Annotated[int, BeforeValidator(_whole), Field(strict=True, ge=1, le=C.MAX_PODS)]] = Field(
        None, description="an endpoint (kind inference): copies of the server behind its one URL, each with the "
                          "job's gpus, cpu and memory (default 1)")
    share: Optional[Share] = Field(
        None, description="an endpoint: the other users and groups who may call it (default: its owner only)")


class EndpointOut(BaseModel):
    endpoint: Optional[str] = Field(
        None, description="an endpoint: its URL path through the hub (/services/gpupool/endpoints/<id>/); "
                          "null for other jobs")
    endpoint_state: Optional[Literal[C.ENDPOINT_STATES]] = Field(  # type: ignore[valid-type]
        None, description="an endpoint: starting until a replica answers the readiness probe, then ready")
    ready_replicas: int = Field(0, description="an endpoint: replicas that answered the last readiness probe")
    endpoint_restarts: int = Field(0, description="an endpoint: restarts of its servers in the current attempt")
    share: Optional[Share] = None
