"""Prompt views for SFT: teach a cold start to read ICE's instructions and ReflectRL's prompts.

ICE (arXiv 2608.02087) and ReflectRL (arXiv 2608.03972) both condition rollouts on extra
context: an instruction line before the question (ICE), or a golden negative trajectory and a
request to fix it (ReflectRL). Both papers check first that the context helps the starting
policy (ICE's pre-flight; ReflectRL's reflection advantage Δ_ref = E[r | x^R] − E[r | x^D] > 0).
A small model SFT-trained on bare prompts only has never read such a prompt and fails that check
(docs/results.md: 0.001 greedy accuracy under a hint, Δ_ref ≈ −0.4). These views put the same
kinds of prompt into its SFT data, so that the RL stage starts from a policy the methods'
premise holds for:

  bare     x                                    → the task's demonstration (slips included)
  hint     I_j ⊕ x  (`ice.conditioned_prompt`)   → the exact solution (`task.exact_demonstration`)
  reflect  x^R(x, o⁻) (`reflect_rl.reflective_prompt`, o⁻ the task's golden negative)
                                                → the exact solution

With the task's `demo_slip` > 0 the bare demonstrations are a sloppy teacher's and the hinted
and reflective ones a careful teacher's: the instruction-conditioned (or reflective) policy is
then better than the bare one by construction of the data, the situation both papers start from
(an instruction that elicits behaviour the model can already produce). What the RL stage must
show is whether each method moves that ability into the bare-prompt policy faster than plain RL.

Per row of a step's global batch the view is drawn with `np.random.default_rng([seed, step,
row])`: u < hint_frac → hint (instruction j uniform), u < hint_frac + reflect_frac → reflect
(bare when the problem has no golden negative), else bare. The draw depends on the step, not on
the process or the resume, so a resumed run sees the same data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_post.methods import ice, reflect_rl

VIEWS = ("bare", "hint", "reflect")


def validate_views(config, task) -> None:
  """Checks `config.sft_views` against the task before anything is built.

  Raises:
    ValueError: naming the key: a fraction outside [0, 1] or fractions summing above 1, hints
      requested with no hint text, a task without `exact_demonstration` (hint / reflect rows
      learn the exact solution) or without `golden_negative` (reflect rows), a reflective
      template without exactly {prompt} and {negative}.
  """
  views = config.sft_views
  for key in ("hint_frac", "reflect_frac"):
    value = float(views[key])
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"config.sft_views.{key}={value} must be in [0, 1]")
  if views.hint_frac + views.reflect_frac > 1.0:
    raise ValueError(f"config.sft_views.hint_frac + reflect_frac = "
                     f"{views.hint_frac + views.reflect_frac} must be <= 1")
  if views.hint_frac > 0:
    hints = tuple(views.hints or ())
    if not hints or not all(isinstance(h, str) and h for h in hints):
      raise ValueError(f"config.sft_views.hint_frac={views.hint_frac} needs non-empty "
                       f"config.sft_views.hints (got {hints!r})")
  if views.hint_frac > 0 or views.reflect_frac > 0:
    if not callable(getattr(task, "exact_demonstration", None)):
      raise ValueError(f"config.sft_views: task {task.name!r} has no exact_demonstration("
                       "record), which hint and reflect rows learn")
  if views.reflect_frac > 0:
    if not callable(getattr(task, "golden_negative", None)):
      raise ValueError(f"config.sft_views.reflect_frac={views.reflect_frac}: task "
                       f"{task.name!r} has no golden_negative(record)")
    reflect_rl.check_template(views.reflect_template)


def active(config) -> bool:
  views = config.get("sft_views")
  return bool(views) and (views.hint_frac > 0 or views.reflect_frac > 0)


def apply_views(records: Sequence[Mapping[str, Any]], task, views, *, seed: int,
                step: int) -> tuple[list[str], list[str], np.ndarray]:
  """(prompts, demonstrations, view index per row) of one SFT batch under `views`.

  Args:
    records: the step's global batch (each with `prompt`, `demonstration`, `index`, `meta`).
    task: the run's task (`exact_demonstration`, `golden_negative` when those views are on).
    views: `config.sft_views` (hint_frac, hints, reflect_frac, reflect_template, reflect_slip).
    seed: the run's seed; with `step` and the row it picks each row's view.
    step: the optimizer step.

  Returns:
    Prompts and demonstrations as strings, and `int[rows]` indices into `VIEWS`.

  Examples:
    >>> from ml_collections import ConfigDict
    >>> from jaxrl_post.tasks.arithmetic import ArithmeticTask
    >>> task = ArithmeticTask(max_digits=2, operations="+", demo_slip=1.0)
    >>> record = task.make_example("train", 3)
    >>> views = ConfigDict(dict(hint_frac=1.0, hints=("Hint: carry.",), reflect_frac=0.0,
    ...                         reflect_template="", reflect_slip="first"))
    >>> prompts, demos, which = apply_views([record], task, views, seed=0, step=1)
    >>> prompts[0] == "Hint: carry.\\n" + record["prompt"], [VIEWS[i] for i in which]
    (True, ['hint'])
    >>> task.reward(record, demos[0]).correct
    1.0
  """
  hints = tuple(views.hints or ())
  negatives = (reflect_rl.TaskNegatives(task, slip=views.reflect_slip, seed=seed)
               if views.reflect_frac > 0 else None)
  prompts, demos, which = [], [], np.zeros(len(records), np.int32)
  for row, record in enumerate(records):
    rng = np.random.default_rng([seed, step, row])
    u = rng.random()
    prompt, demo = str(record["prompt"]), str(record["demonstration"])
    if u < views.hint_frac:
      prompt = ice.conditioned_prompt(prompt, hints[int(rng.integers(len(hints)))])
      demo, which[row] = task.exact_demonstration(record), 1
    elif u < views.hint_frac + views.reflect_frac:
      negative = negatives(record)
      if negative is not None:
        prompt = reflect_rl.reflective_prompt(views.reflect_template, prompt, negative)
        demo, which[row] = task.exact_demonstration(record), 2
    prompts.append(prompt)
    demos.append(demo)
  return prompts, demos, which
