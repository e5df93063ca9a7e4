"""Jinja2 environments for the HTML gpupool renders itself (the spawn form, the widgets).

Autoescaping is on for every template: values are escaped exactly once, where they are written."""
from __future__ import annotations

import functools
import os

import jinja2


@functools.lru_cache(maxsize=None)
def environment(package_dir: str) -> jinja2.Environment:
    """The environment of the ``templates/`` folder next to a package's modules (package data)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(package_dir, "templates")),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    from . import contract

    env.filters.update(bytes=contract.format_bytes, gpus=contract.format_gpus,
                       allocation=contract.describe_allocation, num=lambda x: f"{x:g}")
    return env


def render(package_dir: str, name: str, **context) -> str:
    return environment(package_dir).get_template(name).render(**context)
