"""Multi-phase training as one optax transformation: parameter groups, frozen groups, per-group lr.

A *phase* (linear probing, full fine-tuning, reinforcement fine-tuning, …) says which parameter
groups train and at which multiple of the base learning rate:

  rules = GROUP_RULES.get("recommender")          # group ← path predicates
  labels = group_labels(params, rules)            # one group name per parameter leaf
  tx = phase_optimizer({"backbone": 0.1, "heads": 1.0}, labels,
                       lambda m: optax.adam(1e-4 * m), key="config.phases.fft")

`optax.multi_transform` gives every group with multiplier m > 0 its own `make_optimizer(m)`
(its own moments) and every group with m = 0 (or absent) `optax.set_to_zero()`: a frozen
group's update is exactly zero and it keeps no optimizer state. The phase schedule of
"Progressive Alignment of Recommender Foundation Model through Multi-Phase Post-Training"
(arXiv 2608.06792): LP freezes the backbone and trains the new modules; FFT
trains everything with the backbone at 1/10 of the heads' rate (1e-5 vs 1e-4); RFT freezes the
reward and propensity heads (`RECSYS_PHASES`).

Paths are the `/`-joined keys of a parameter leaf (`backbone/gru/w_z`); a predicate is any
`str -> bool` (`prefix("backbone")`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax

from jaxrl_post.registry import Registry

Predicate = Callable[[str], bool]
Rules = Sequence[tuple[str, Predicate]]

# Named sets of (group, predicate) rules; the first rule that matches a path labels it.
GROUP_RULES: Registry[Rules] = Registry("param_groups")


def prefix(*prefixes: str) -> Predicate:
  """A predicate true for paths equal to, or under, one of `prefixes` (`"a"` matches `a/b`).

  Examples:
    >>> p = prefix("backbone", "encoder")
    >>> p("backbone/gru/w_z"), p("encoder"), p("backbones/x")
    (True, True, False)
  """
  return lambda path: any(path == p or path.startswith(p + "/") for p in prefixes)


GROUP_RULES.add("recommender", (
  ("backbone", prefix("backbone")),
  ("heads", prefix("encoder", "policy_head")),
  ("reward", prefix("reward_head")),
  ("propensity", prefix("propensity_head")),
))

# The paper's phases as learning-rate multipliers of `config.optimizer.lr`; 0 / absent =
# frozen. sft1 is the one-phase baseline (everything at the base rate).
RECSYS_PHASES = {
  "sft1": {"backbone": 1.0, "heads": 1.0, "reward": 1.0, "propensity": 1.0},
  "lp": {"backbone": 0.0, "heads": 1.0, "reward": 1.0, "propensity": 1.0},
  "fft": {"backbone": 0.1, "heads": 1.0, "reward": 1.0, "propensity": 1.0},
  "rft": {"backbone": 0.1, "heads": 1.0, "reward": 0.0, "propensity": 0.0},
}


def path_string(path: Sequence[Any]) -> str:
  """`a/b/c` from a `jax.tree_util` key path (dict keys, attributes, indices; an `nnx`
  variable's trailing `.value` dropped)."""
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    else:
      parts.append(str(k))
  if parts and parts[-1] == "value":
    parts.pop()
  return "/".join(parts)


def group_labels(params: Any, rules: Rules) -> Any:
  """The group name of every leaf of `params` (same tree structure): the first matching rule.

  Raises:
    ValueError: a parameter no rule matches (naming its path and the groups).
  """

  def label(path, _):
    name = path_string(path)
    for group, predicate in rules:
      if predicate(name):
        return group
    raise ValueError(f"parameter {name!r} is in no parameter group; groups: "
                     f"{', '.join(g for g, _ in rules)}")

  return jax.tree_util.tree_map_with_path(label, params)


def check_phase(multipliers: Mapping[str, float], groups: Sequence[str], *,
                key: str = "phase") -> dict[str, float]:
  """Every group's lr multiplier (absent = 0 = frozen), validated.

  Raises:
    ValueError: naming `key` for an unknown group, a negative multiplier, or a phase that
      freezes every group.
  """
  unknown = sorted(set(multipliers) - set(groups))
  if unknown:
    raise ValueError(f"{key}: unknown parameter group(s) {unknown}; valid: {', '.join(groups)}")
  out = {g: float(multipliers.get(g, 0.0)) for g in groups}
  for g, m in out.items():
    if m < 0:
      raise ValueError(f"{key}.{g}={m}: a learning-rate multiplier must be >= 0")
  if not any(out.values()):
    raise ValueError(f"{key}={dict(multipliers)} freezes every parameter group "
                     f"({', '.join(groups)}): nothing would train")
  return out


def phase_optimizer(multipliers: Mapping[str, float], labels: Any,
                    make_optimizer: Callable[[float], optax.GradientTransformation], *,
                    groups: Sequence[str] | None = None,
                    key: str = "phase") -> optax.GradientTransformation:
  """`optax.multi_transform`: `make_optimizer(m_g)` for groups with m_g > 0, zero otherwise.

    u_p = 0                          for p in a frozen group (m_g = 0): `optax.set_to_zero()`
    u_p = make_optimizer(m_g)(g_p)   otherwise (e.g. AdamW at lr·m_g, its own moments)

  Args:
    multipliers: `{group: lr multiplier}`; absent groups are frozen.
    labels: the group labels of the parameters (`group_labels`), or a function of the
      parameters returning them.
    make_optimizer: the transformation of a trained group, given its multiplier.
    groups: all group names (default: the keys of `multipliers`); with `labels` a tree, the
      labels that occur are added.
    key: the config key named in errors (`config.phases.lp`).

  Raises:
    ValueError: naming `key` (`check_phase`).
  """
  names = list(groups) if groups is not None else list(multipliers)
  if not callable(labels):
    names += [g for g in sorted(set(jax.tree.leaves(labels))) if g not in names]
  checked = check_phase(multipliers, names, key=key)
  transforms = {g: make_optimizer(m) if m > 0 else optax.set_to_zero()
                for g, m in checked.items()}
  return optax.multi_transform(transforms, labels)
