"""What kind of editor each configuration field needs, read from the pydantic models' types, so
the panel follows the models instead of restating them. Pure Python (no Qt) so it is testable."""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

from app.config import RunConfig
from app.labels import humanize

__all__ = ["EditorKind", "FieldSpec", "field_spec", "get_path", "humanize", "with_value"]

EditorKind = Literal["choice", "bool", "tristate", "int", "float", "text", "list"]


@dataclass(frozen=True)
class FieldSpec:
    """One editable leaf of :class:`RunConfig`: path, editor kind, bounds and default."""

    path: str
    kind: EditorKind
    optional: bool
    default: Any
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    description: str = ""
    item_type: str = "str"  # for lists: "str" or "float"

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    """``Annotated[str, validator]`` -> (str, [validator])."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        return base, list(meta)
    return annotation, []


def _unwrap_optional(annotation: Any) -> tuple[Any, bool, list[Any]]:
    annotation, meta = _strip_annotated(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            inner, inner_meta = _strip_annotated(args[0])
            return inner, True, meta + inner_meta
    return annotation, False, meta


def field_spec(path: str, model: type[BaseModel] = RunConfig) -> FieldSpec:
    """Describe the field at a dotted path (``features.speculative.method``)."""
    cls: type[BaseModel] = model
    parts = path.split(".")
    for part in parts[:-1]:
        inner = cls.model_fields[part].annotation
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            raise KeyError(f"{path}: {part} is not a nested model")
        cls = inner
    info = cls.model_fields[parts[-1]]
    annotation, optional, extra_meta = _unwrap_optional(info.annotation)
    minimum = maximum = None
    for meta in [*info.metadata, *extra_meta]:
        if isinstance(meta, annotated_types.Ge):
            minimum = float(meta.ge)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Gt):
            minimum = float(meta.gt)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Le):
            maximum = float(meta.le)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Lt):
            maximum = float(meta.lt)  # type: ignore[arg-type]
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    common: dict[str, Any] = {"path": path, "optional": optional, "default": default, "minimum": minimum,
                              "maximum": maximum, "description": info.description or ""}
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return FieldSpec(kind="choice", choices=tuple(str(a) for a in typing.get_args(annotation)), **common)
    if isinstance(annotation, type) and issubclass(annotation, enum.StrEnum):
        return FieldSpec(kind="choice", choices=tuple(member.value for member in annotation), **common)
    if annotation is bool:
        return FieldSpec(kind="tristate" if optional else "bool", **common)
    if annotation is int:
        return FieldSpec(kind="int", **common)
    if annotation is float:
        return FieldSpec(kind="float", **common)
    if annotation is str:
        return FieldSpec(kind="text", **common)
    if origin is list:
        inner = typing.get_args(annotation)[0] if typing.get_args(annotation) else str
        inner, _ = _strip_annotated(inner)
        return FieldSpec(kind="list", item_type="float" if inner in (float, int) else "str", **common)
    raise TypeError(f"{path}: no editor for {info.annotation!r}")


def get_path(obj: BaseModel, path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = getattr(value, part)
    return value


def with_value(config: RunConfig, path: str, value: Any) -> RunConfig:
    """A new, fully validated RunConfig with one field changed (raises pydantic.ValidationError)."""
    data = config.model_dump()
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return RunConfig.model_validate(data)
