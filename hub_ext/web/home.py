"""The hub's home page (templates/hub/home.html): a notice per suspended server of the user, with a
one-click resume."""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from ..domain.idle_rules import clock_words


def home_notices(user: Any) -> list[dict]:
    """``gpupool_notices`` of the hub's home page (``c.JupyterHub.template_vars``): one per server of
    ``user`` that is stopped because it was suspended, with a link that starts it again with the
    same options (``/hub/spawn/...?opt-gpus=1&opt-queue=...``: one click). The spawner noted the
    suspension when it stopped the server (spawner/mixin.py); nothing here does I/O."""
    out = []
    for name, spawner in sorted((getattr(user, "spawners", None) or {}).items()):
        sus = getattr(spawner, "gpupool_suspension", None)
        if not sus or spawner.active:
            continue
        opts = {f"opt-{k}": ("on" if v is True else v) for k, v in (sus.get("options") or {}).items() if v is not False}
        base = getattr(user, "base_url", "/").split("/user/")[0].rstrip("/")  # the hub's base URL
        path = f"{base}/hub/spawn/{quote(user.name, safe='')}" + (f"/{quote(name, safe='')}" if name else "")
        label = f"server {name}" if name else "your server"
        out.append({"server": name, "title": f"{label[0].upper()}{label[1:]} was suspended at "
                                              f"{clock_words(_epoch(sus.get('suspended_at')))}",
                    "reason": sus.get("reason", ""), "resume_url": f"{path}?{urlencode(opts)}",
                    "button": f"Resume {label} with the same options"})
    return out


def _epoch(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()
