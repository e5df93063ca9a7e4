"""Finding the gpupool service and a token.

Resolution order (first hit wins, URL and token resolved independently):

1. arguments: ``gpupool.connect(url=..., token=...)`` / ``--url`` / ``--token``
2. environment: ``GPUPOOL_URL`` / ``GPUPOOL_TOKEN``
3. inside a gpupool job: ``GPUPOOL_API_URL`` / ``GPUPOOL_API_TOKEN`` (set by the service)
4. the config file: ``$GPUPOOL_CLIENT_CONFIG`` or ``~/.config/gpupool/config.json``
   (``$XDG_CONFIG_HOME/gpupool/config.json`` when XDG_CONFIG_HOME is set), e.g.
   ``{"url": "https://hub.example.org", "token": "..."}``
5. inside a JupyterHub single-user server: the hub's public URL
   (``JUPYTERHUB_PUBLIC_HUB_URL``) or the hub API URL (``JUPYTERHUB_API_URL``) plus
   ``JUPYTERHUB_BASE_URL``, giving ``{hub base}/services/gpupool/api/v1/``, and the server's own
   ``JUPYTERHUB_API_TOKEN``.

Any URL may name the hub (``http://hub:8000``), the service (``.../services/gpupool/``) or the
API itself (``.../services/gpupool/api/v1/``); :func:`api_base` normalises it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..protocol import Env

SERVICE_NAME_ENV = "GPUPOOL_SERVICE_NAME"
DEFAULT_SERVICE_NAME = "gpupool"


def service_name() -> str:
    return os.environ.get(SERVICE_NAME_ENV) or DEFAULT_SERVICE_NAME


def config_path() -> Path:
    """The config file consulted when neither arguments nor environment give a URL/token."""
    explicit = os.environ.get("GPUPOOL_CLIENT_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpupool" / "config.json"


def api_base(url: str, name: str | None = None) -> str:
    """Normalise a hub / service / API URL to the API root ending in ``/api/v1/``."""
    name = name or service_name()
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/api/v1"):
        pass
    elif path.endswith(f"/services/{name}"):
        path += "/api/v1"
    else:
        if path.endswith("/hub/api"):
            path = path[: -len("/hub/api")]
        elif path.endswith("/hub"):
            path = path[: -len("/hub")]
        path += f"/services/{name}/api/v1"
    return urlunsplit((parts.scheme, parts.netloc, path + "/", "", ""))


def hub_base(url: str, name: str | None = None) -> str:
    """The hub's public base URL (``https://hub.example.org/jhub/``) from a hub, service or API URL."""
    api = api_base(url, name)
    parts = urlsplit(api)
    base = parts.path[: -len(f"services/{name or service_name()}/api/v1/")]
    return urlunsplit((parts.scheme, parts.netloc, base, "", ""))


def save_config(url: str, token: str, user: str | None = None) -> Path:
    """Write ``{"url", "token", "user"}`` to the config file, readable by its owner only (0600)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"url": url, "token": token}
    if user:
        data["user"] = user
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # also when the file existed with wider permissions
        json.dump(data, f, indent=1)
        f.write("\n")
    return path


def _read_config_file() -> tuple[dict, Path | None]:
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, None
    except OSError as e:  # unreadable: say so rather than silently ignoring it
        raise ConfigError(f"cannot read gpupool config file {path}: {e.strerror}") from None
    try:
        data = json.loads(text or "{}")
    except ValueError as e:
        raise ConfigError(f"gpupool config file {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"gpupool config file {path} must hold a JSON object such as "
                          '{"url": "https://hub.example.org", "token": "..."}')
    return data, path


class ConfigError(Exception):
    """The client cannot work out where the service is or which token to use."""


@dataclass(frozen=True)
class Connection:
    url: str  # API root, ending in /api/v1/
    token: str | None
    url_source: str
    token_source: str | None


def _hub_candidates(env) -> list[tuple[str, str]]:
    """Service URLs derived from a single-user server's JupyterHub environment."""
    out: list[tuple[str, str]] = []
    public_hub = env.get("JUPYTERHUB_PUBLIC_HUB_URL")
    if public_hub:
        out.append((api_base(public_hub), "JUPYTERHUB_PUBLIC_HUB_URL"))
    api = env.get("JUPYTERHUB_API_URL")
    if api:
        p = urlsplit(api)
        base = env.get("JUPYTERHUB_BASE_URL") or "/"
        if not base.endswith("/"):
            base += "/"
        out.append((api_base(urlunsplit((p.scheme, p.netloc, base, "", ""))),
                    "JUPYTERHUB_API_URL + JUPYTERHUB_BASE_URL"))
    return out


def resolve(url: str | None = None, token: str | None = None, env=None) -> Connection:
    """Work out the API URL and token (see the module docstring for the order)."""
    env = os.environ if env is None else env
    url_source = token_source = None
    if url:
        url_source = "argument"
    elif env.get("GPUPOOL_URL"):
        url, url_source = env["GPUPOOL_URL"], "GPUPOOL_URL"
    elif env.get(Env.API_URL):  # inside a job (the job protocol's names)
        url, url_source = env[Env.API_URL], Env.API_URL
    if token:
        token_source = "argument"
    elif env.get("GPUPOOL_TOKEN"):
        token, token_source = env["GPUPOOL_TOKEN"], "GPUPOOL_TOKEN"
    elif env.get(Env.API_TOKEN) and (url_source in (None, Env.API_URL)):
        token, token_source = env[Env.API_TOKEN], Env.API_TOKEN
    if not url or not token:
        data, path = _read_config_file()
        if not url and data.get("url"):
            url, url_source = str(data["url"]), str(path)
        if not token and data.get("token"):
            token, token_source = str(data["token"]), str(path)
    if not url:
        cands = _hub_candidates(env)
        if cands:
            url, url_source = cands[0]
    if not token and env.get("JUPYTERHUB_API_TOKEN"):
        token, token_source = env["JUPYTERHUB_API_TOKEN"], "JUPYTERHUB_API_TOKEN"
    if not url:
        raise ConfigError(
            "gpupool does not know where the hub is: run `gpupool login https://your-hub` (it stores the URL and "
            f"a token in {config_path()}), or set GPUPOOL_URL and GPUPOOL_TOKEN; in Python, "
            "gpupool.connect(url=..., token=...) (inside a JupyterHub server this is found automatically)")
    return Connection(api_base(url), token, url_source or "", token_source)


def hub_candidates(env=None) -> list[tuple[str, str]]:
    return _hub_candidates(os.environ if env is None else env)
