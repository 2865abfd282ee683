"""Quoting for each destination of an export, and the template environment that applies it.

Every value written into a script, a manifest or a report passes one of these filters: ``sh``
(shell words), ``comment`` (inside a ``#`` line), ``yaml``/``compose``/``k8s`` (YAML scalars where
compose's ``${VAR}`` and Kubernetes' ``$(VAR)`` expansion cannot fire), and HTML autoescaping.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from typing import Any

import jinja2


def comment_text(text: Any) -> str:
    """Text safe inside a ``#`` comment of any format: one line, control characters escaped."""
    return json.dumps(str(text), ensure_ascii=True)[1:-1]


def yaml_str(value: Any, dollar: str = "$") -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML); ``dollar`` replaces ``$`` so that
    compose's ``${VAR}`` and Kubernetes' ``$(VAR)`` expansion cannot fire."""
    return json.dumps(str(value).replace("$", dollar), ensure_ascii=True)


def compose_str(value: Any) -> str:
    return yaml_str(value, "$$")


def k8s_str(value: Any) -> str:
    return yaml_str(value, "$$")


def slug(text: str) -> str:
    """A DNS-1123 name for Kubernetes objects."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return out or "vllm"


@cache
def templates() -> jinja2.Environment:
    """The templates in ``assets/templates`` with the quoting filters (HTML autoescaped)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("assets", "templates"), autoescape=jinja2.select_autoescape(
        enabled_extensions=("html", "html.j2")), keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)
    env.filters.update(sh=shlex.quote, comment=comment_text, compose=compose_str, k8s=k8s_str, yaml=yaml_str)
    return env
