"""DAPO's overlong reward shaping (arXiv 2503.14476, §3.4 "soft overlong punishment").

A completion cut at the generation budget is usually unfinished; scoring it only as "wrong"
gives the same signal as a finished wrong answer. DAPO adds a length penalty that is zero for
completions comfortably inside the budget, grows linearly over the last `cache_len` tokens
before `max_len`, and is −1 past it:

  R_len(L) = 0                                   if L ≤ max_len − cache_len
           = ((max_len − cache_len) − L) / cache_len   if max_len − cache_len < L ≤ max_len
           = −1                                  if L > max_len

It is one column of the reward matrix (`methods.grpo.verify_groups`, `config.reward_weights`
names it "overlong"; `config.overlong.max_len` / `config.overlong.cache_len` set the window).
With `cache_len = 0` the penalty is a hard −1 past `max_len`. Host-side numpy: the reward matrix
is assembled on the host before the advantage estimator.
"""

from __future__ import annotations

import numpy as np


def check_overlong_window(*, max_len: int, cache_len: int) -> None:
  """Raises a ValueError naming `config.overlong.*` unless 0 ≤ cache_len ≤ max_len, max_len > 0."""
  if max_len <= 0:
    raise ValueError(f"config.overlong.max_len={max_len} must be > 0 (0 in the config means "
                     "config.max_new_tokens)")
  if not 0 <= cache_len <= max_len:
    raise ValueError(f"config.overlong.cache_len={cache_len} must be in [0, "
                     f"config.overlong.max_len={max_len}]")


def overlong_window(config) -> tuple[int, int]:
  """`(max_len, cache_len)` from `config.overlong`, `max_len` 0 meaning `config.max_new_tokens`.

  Raises:
    ValueError: naming `config.overlong` when the section (or one of its two keys) is missing,
      and `check_overlong_window`'s errors.
  """
  section = config.get("overlong")
  if section is None or "max_len" not in section or "cache_len" not in section:
    raise ValueError("config.reward_weights names 'overlong' but config.overlong is missing or "
                     "incomplete: set config.overlong = dict(max_len=..., cache_len=...) "
                     "(max_len 0 = config.max_new_tokens)")
  max_len = int(section["max_len"]) or int(config.max_new_tokens)
  cache_len = int(section["cache_len"])
  check_overlong_window(max_len=max_len, cache_len=cache_len)
  return max_len, cache_len


def overlong_penalty(lengths, *, max_len: int, cache_len: int) -> np.ndarray:
  """DAPO's soft overlong penalty per completion (see the module docstring for the formula).

  Args:
    lengths: `[rows]` completion lengths in tokens (ints or floats, e.g. the completion mask
      summed over time).
    max_len: L_max, the length past which the penalty is −1.
    cache_len: L_cache, the width of the linear ramp ending at `max_len`; 0 = no ramp.

  Returns:
    `float32[rows]`, each in [−1, 0].

  Raises:
    ValueError: naming `config.overlong.cache_len` / `config.overlong.max_len` when
      cache_len < 0, cache_len > max_len or max_len ≤ 0.

  Examples:
    >>> overlong_penalty([10, 16, 18, 20, 21], max_len=20, cache_len=4).tolist()
    [0.0, 0.0, -0.5, -1.0, -1.0]

  References:
    Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476.
  """
  check_overlong_window(max_len=max_len, cache_len=cache_len)
  lengths = np.asarray(lengths, np.float64)
  if lengths.ndim != 1:
    raise ValueError(f"overlong_penalty: lengths must be [rows], got shape {lengths.shape}")
  start = max_len - cache_len
  ramp = (start - lengths) / max(cache_len, 1)
  out = np.where(lengths <= start, 0.0, np.where(lengths <= max_len, ramp, -1.0))
  return out.astype(np.float32)
