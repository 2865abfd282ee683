"""An attribute that one of an object's parts holds, read through the object: how the window
offers what its helpers keep (``running`` is ``window.runs.running``) and the configuration's Qt
face what its model keeps, each written once as ``running = Forwarded[bool]("runs")``."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Forwarded(Generic[T]):
    """Read-only: ``obj.<name>`` is ``obj.<part>.<name>``, the name being the attribute's own
    unless ``name`` says the part's."""

    def __init__(self, part: str, name: str = "") -> None:
        self.part = part
        self.name = name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forwarded[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Forwarded[T] | T:
        if obj is None:
            return self
        value: Any = getattr(getattr(obj, self.part), self.name)
        return value  # T as declared where it is forwarded
