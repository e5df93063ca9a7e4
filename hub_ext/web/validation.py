"""Validation errors as the API's 400: a request that fails its model (web/schemas.py) becomes
one :class:`Invalid` whose message starts with the field's name (``"gpus: must be a number"``)
and whose payload names it (``"field": "gpus"``)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from .schemas import Query


class Invalid(Exception):
    """A request that fails its model: ``field`` and a message starting with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, f"{field}: {message}"


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _words(err: dict, model: type[BaseModel]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        what = "parameter" if issubclass(model, Query) else "field"
        return f"unknown {what} (allowed: {', '.join(sorted(model.model_fields))})"
    if kind.startswith("int_"):
        return "must be an integer"
    if kind == "finite_number":
        return "must be a finite number"
    if kind.startswith("float_"):
        return "must be a number"
    if kind.startswith("bool_"):
        return "must be true or false"
    if kind.startswith("string_type"):
        return "must be a string"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be an object"
    if kind == "list_type":
        return "must be a list"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        return "must not be blank" if ctx.get("pattern") == r"\S" else f"must match {ctx.get('pattern')}"
    if kind == "greater_than_equal":
        return f"must be >= {_num(ctx.get('ge'))}"
    if kind == "greater_than":
        return f"must be > {_num(ctx.get('gt'))}"
    if kind == "less_than_equal":
        return f"must be at most {_num(ctx.get('le'))}"
    if kind == "less_than":
        return f"must be below {_num(ctx.get('lt'))}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '').replace(chr(39), '')}"
    if kind == "value_error":
        return str(ctx.get("error") or err.get("msg"))
    return str(err.get("msg") or "is not valid")


def parse(model: type[BaseModel], data: Any) -> Any:
    """``model`` from ``data`` (a dict), or :class:`Invalid` naming the first bad field."""
    if not isinstance(data, dict):
        raise Invalid("body", "must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [str(x) for x in err.get("loc", ()) if not isinstance(x, int)]
        field = loc[0] if loc else "body"
        raise Invalid(field, _words(err, model)) from None
