"""The Jinja2 environment of the alerts package: templates in `alerts/templates/`."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jinja2


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("alerts", "templates"),
        undefined=jinja2.StrictUndefined,  # a misspelt variable fails loudly, never renders ""
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    # JSON strings are valid YAML double-quoted scalars: safe quoting for any label value.
    env.filters["yaml_str"] = lambda value: json.dumps(str(value), ensure_ascii=False)
    return env


def render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)
