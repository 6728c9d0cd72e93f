"""Meshes, logical-axis rules and sharding helpers."""

from jaxrl_post.parallel.axes import (
  DEFAULT_RULES,
  axis_rules,
  constrain,
  current_rules,
  logical_sharding,
  logical_to_spec,
  state_shardings,
)

__all__ = [
  "DEFAULT_RULES",
  "axis_rules",
  "constrain",
  "current_rules",
  "logical_sharding",
  "logical_to_spec",
  "state_shardings",
]
