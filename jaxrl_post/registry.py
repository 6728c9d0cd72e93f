"""String-keyed registries for the swappable parts of the library.

A config names a variant (`model="qwen3_0p6b"`, `advantage="grpo"`); the
registry maps the name to the object. An unknown name raises an error that
lists the valid ones, so a typo in a config fails at start-up, not mid-run.

  MODELS = Registry("model")

  @MODELS.register("tiny")
  def tiny(): ...

  MODELS.get("tiny")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """A named mapping from strings to objects, with helpful lookup errors."""

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator: registers the decorated object under `name`."""

    def decorator(obj: T) -> T:
      self.add(name, obj)
      return obj

    return decorator

  def add(self, name: str, obj: T) -> None:
    if name in self._entries:
      raise ValueError(f"{self.kind} {name!r} is already registered")
    self._entries[name] = obj

  def get(self, name: str) -> T:
    try:
      return self._entries[name]
    except KeyError:
      raise KeyError(
        f"unknown {self.kind} {name!r}; valid names: {', '.join(sorted(self._entries))}"
      ) from None

  def build(self, name: str, **knobs: Any):
    """Instantiates the dataclass registered as `name` with `knobs` (its init fields).

    Raises:
      KeyError: for an unknown name, listing the valid ones.
      TypeError: for an unknown knob, listing the dataclass's knobs.
    """
    cls = self.get(name)
    valid = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
      raise TypeError(
        f"{self.kind} {name!r} has no knob(s) {unknown}; valid knobs: {', '.join(valid)}")
    return cls(**knobs)

  def names(self) -> list[str]:
    return sorted(self._entries)

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._entries))
