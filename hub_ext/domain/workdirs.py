"""Where a user's jobs run: ``c.GPUPool.work_dir`` with ``{home}`` (from the system's user
database) and ``{user}`` filled in."""
from __future__ import annotations

import os
import pwd


def user_workdir(template: str, user: str) -> str:
    """The user's working directory; ValueError (a sentence for the user) when ``{home}`` names
    a system user that does not exist."""
    home = ""
    if "{home}" in template:
        try:
            home = pwd.getpwnam(user).pw_dir
        except KeyError:
            raise ValueError(f"there is no system user {user!r} to find a home directory for "
                             "(an admin can set c.GPUPool.work_dir, e.g. '/srv/homes/{user}')") from None
    return os.path.abspath(template.format(home=home, user=user))
