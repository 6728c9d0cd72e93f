"""ReflectRL's reflective → direct prompt schedule (arXiv 2608.03972).

ReflectRL trains one policy through two prompt interfaces on the same problem q:

  direct      x^D(q)       = Chat_D(q)
  reflective  x^R(q, o⁻)   = Chat_R(q, o⁻): a golden negative trajectory o⁻ (a strong model's
                             answer-wrong solution, usually a long valid prefix and a local
                             error) is shown, and the model is asked to find the error and answer.

Of the N rollouts of a prompt, K_t use x^R and N − K_t use x^D (RLVR, Eq. 7):

    τ(t) = clip((t − t_warm) / t_trans, 0, 1)
    g(t) = p_l + ((p_h − p_l) / 2) · (1 + cos(π τ(t)))                    "cosine" (the paper's)
    K_t  = round(N · g(t))                       (round half up; K_t = 0 once τ reaches 1)

The group stays one group: the GRPO advantage normalises over all N rewards (direct and
reflective together, Eq. 9), and each rollout's log-probs are taken under its own prompt.
The OPD variant (Eq. 11) uses the same kernel for the share of samples whose *teacher* scores
the student's tokens under x^R; the student always samples from x^D.

`REFLECT_KERNELS` holds the paper's cosine kernel and two ablation shapes ("linear"; "step":
the abrupt removal at τ = 1/2 that the paper reports hurts). p_h, p_l, the warm-up and the
transition length are not given in the paper: our PROPOSAL defaults are p_h = 0.5, p_l = 0,
no warm-up and a transition over the first 60 % of the steps. So is `truncate_negative`'s
rule for a golden negative longer than its budget (keep its first `head` tokens and its end,
where the error usually is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

REFLECT_KERNELS: Registry = Registry("reflect kernel")

# PROPOSAL defaults (the paper gives none): see the module docstring.
P_HIGH, P_LOW, TRANSITION_FRACTION = 0.5, 0.0, 0.6


def schedule_progress(step, *, warmup_steps: int, transition_steps: int):
  """τ(t) = clip((t − t_warm) / t_trans, 0, 1); t_trans = 0 switches at once after warm-up.

  Examples:
    >>> float(schedule_progress(30, warmup_steps=10, transition_steps=40))
    0.5
  """
  step = jnp.asarray(step, jnp.float32)
  if transition_steps <= 0:
    return (step > warmup_steps).astype(jnp.float32)
  return jnp.clip((step - warmup_steps) / float(transition_steps), 0.0, 1.0)


@REFLECT_KERNELS.register("cosine")
def cosine_kernel(tau, *, p_high: float = P_HIGH, p_low: float = P_LOW):
  """g = p_l + ((p_h − p_l)/2)(1 + cos πτ) (Eq. 7 of arXiv 2608.03972): p_h at τ = 0, p_l at 1.

  Examples:
    >>> [round(float(cosine_kernel(t)), 4) for t in (0.0, 0.5, 1.0)]
    [0.5, 0.25, 0.0]
  """
  tau = jnp.asarray(tau, jnp.float32)
  return p_low + 0.5 * (p_high - p_low) * (1.0 + jnp.cos(jnp.pi * tau))


@REFLECT_KERNELS.register("linear")
def linear_kernel(tau, *, p_high: float = P_HIGH, p_low: float = P_LOW):
  """g = p_h + (p_l − p_h) τ (ablation shape).

  Examples:
    >>> round(float(linear_kernel(0.25)), 4)
    0.375
  """
  tau = jnp.asarray(tau, jnp.float32)
  return p_high + (p_low - p_high) * tau


@REFLECT_KERNELS.register("step")
def step_kernel(tau, *, p_high: float = P_HIGH, p_low: float = P_LOW):
  """g = p_h for τ < 1/2, p_l afterwards: the abrupt removal the paper reports hurts (ablation).

  Examples:
    >>> [float(step_kernel(t)) for t in (0.49, 0.5)]
    [0.5, 0.0]
  """
  tau = jnp.asarray(tau, jnp.float32)
  return jnp.where(tau < 0.5, p_high, p_low).astype(jnp.float32)


def reflective_fraction(step, *, total_steps: int, kernel: str = "cosine",
                        warmup_steps: int = 0, transition_steps: int | None = None,
                        p_high: float = P_HIGH, p_low: float = P_LOW):
  """g(t): the share of a group's rollouts that use the reflective prompt at step `step`.

  Args:
    step: the training step t (1-based in this codebase's loop; any scalar works).
    total_steps: the run's length; `transition_steps=None` means 60 % of it (PROPOSAL).
    kernel: a `REFLECT_KERNELS` name.

  Raises:
    ValueError: an unknown kernel, or p_h / p_l outside [0, 1].

  Examples:
    >>> round(float(reflective_fraction(30, total_steps=100)), 4)   # τ = 0.5
    0.25
    >>> float(reflective_fraction(60, total_steps=100))
    0.0
  """
  fn = REFLECT_KERNELS.get(kernel)
  for name, p in (("p_high", p_high), ("p_low", p_low)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"{name}={p} must be in [0, 1]")
  if transition_steps is None:
    transition_steps = int(round(TRANSITION_FRACTION * total_steps))
  tau = schedule_progress(step, warmup_steps=warmup_steps, transition_steps=transition_steps)
  return fn(tau, p_high=p_high, p_low=p_low)


def reflective_count(num_rollouts: int, fraction) -> int:
  """K_t = round(N · g), rounding halves up (host side: it sets how prompts are built).

  Examples:
    >>> reflective_count(8, 0.5), reflective_count(8, 0.3125), reflective_count(8, 0.0)
    (4, 3, 0)
  """
  value = float(num_rollouts) * float(fraction)
  return int(min(max(math.floor(value + 0.5), 0), num_rollouts))


def reflective_rows(group_ids: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
  """bool `[rows]`: the first `count` rollouts of every group (in row order) are reflective.

  Examples:
    >>> reflective_rows([0, 0, 0, 1, 1, 1], 2).astype(int).tolist()
    [1, 1, 0, 1, 1, 0]
  """
  group_ids = np.asarray(group_ids)
  seen: dict[int, int] = {}
  out = np.zeros(group_ids.shape, bool)
  for i, g in enumerate(group_ids.tolist()):
    out[i] = seen.get(g, 0) < count
    seen[g] = seen.get(g, 0) + 1
  return out


def truncate_negative(tokens: Sequence[int], budget: int, *, head: int = 256) -> list[int]:
  """A golden negative trajectory cut to `budget` tokens: its first `head` and its last
  `budget − head` tokens (the error is usually near the end; PROPOSAL, the paper says not).

  Examples:
    >>> truncate_negative(list(range(10)), 6, head=2)
    [0, 1, 6, 7, 8, 9]
    >>> truncate_negative([1, 2, 3], 6)
    [1, 2, 3]
  """
  tokens = list(tokens)
  if budget < 0:
    raise ValueError(f"budget={budget} must be >= 0")
  if len(tokens) <= budget:
    return tokens
  head = min(head, budget)
  tail = budget - head
  return tokens[:head] + (tokens[len(tokens) - tail:] if tail else [])
