"""ReflectRL (arXiv 2608.03972): RLVR whose groups mix reflective and direct prompts of a problem.

For each problem q with a golden negative trajectory o⁻ (a strong model's answer-wrong solution:
a long valid prefix and a local error), K_t of its N rollouts are sampled from the reflective
prompt and N − K_t from the direct one:

  direct      x^D(q)       = the task's prompt, unchanged
  reflective  x^R(q, o⁻)   = `config.reflect.template` with {prompt} = x^D(q), {negative} = o⁻

  g(t) = p_l + ((p_h − p_l)/2)(1 + cos π τ(t)),  K_t = round(N · g(t))     (Eq. 7;
                                                   `losses.reflective_fraction` / `_count`)

One step (`ReflectRL.step`):

  1. `prompts_per_step` records from the task's train split (the sharded loader, as GRPO);
  2. their rows: per record N = `group_size` rows, the first K_t reflective (0 for a record
     without a golden negative), the rest direct; one `Sampler.generate` call over that flat
     prompt list (one sample per row), or GRPO's own call (N samples per prompt) in a step with
     no reflective row. The rows of a record form ONE group (`group_ids`);
  3. the verifier rewards each row's answer; the advantage (`config.advantage`, GRPO's) is
     normalised over the whole mixed group, reflective and direct rewards together (Eq. 9);
  4. the trainer scores the old policy, each row under its OWN prompt (the rows' prompt tokens
     differ), and `ppo_epochs × ppo_mini_batches` PPO-clipped updates follow
     (`training.ppo.ppo_phase`): (1/N) Σ_i Σ_s min(w Â_i, clip(w) Â_i).

Evaluation is GRPO's (`TaskEvaluator`) on direct prompts only: the inference interface is
unchanged. Metrics: `reflect/fraction` (g), `reflect/count` (K_t; in OPD mode K^batch of the
B rows), `reflect/reward_reflective`, `reflect/reward_direct` (mean correctness of the step's
reflective / direct rows; NaN when there are none), `reflect/delta_ref` (Δ_ref =
E[correct | x^R] − E[correct | x^D], paired over the prompts that have rows of both kinds; NaN
when none), `reflect/prompts_with_negative` (the share of the step's prompts that have a golden
negative), `reflect/rows_reflective` (the share of rows sampled from x^R).

Golden negatives are offline (no model calls): `config.reflect.negatives_path` = '' takes
them from the task (`ArithmeticTask.golden_negative`: the worked solution with one carry
dropped); a path reads a JSONL file of `{"prompt": ..., "negative": ...}` lines (OpenR1-GNT
style), keyed by the exact prompt text. Each is cut to `config.reflect.negative_tokens` tokens
(`losses.truncate_negative`: its first `negative_head` tokens and its end, where the error
usually is; PROPOSAL). A reflective prompt longer than `config.prompt_len` after that is an
error naming `config.prompt_len` (checked on a sample of the train split at start-up and on
every step), never a silent cut of the question.

`config.reflect.mode="opd"` is the paper's OPD variant (Eq. 11): the student samples only
from x^D (GRPO's generate call); a frozen teacher (`config.reflect.teacher`, a checkpoint
directory with the student's vocabulary) scores the student's tokens under x^R(q, o⁻) for
K^batch = round(B · g(t)) of the B rows and under x^D for the rest; the per-token advantage is
the sampled-token reverse-KL reward d_t = lp_T − lp_old (`losses.sampled_token_opd_reward`,
the one-sample estimate of −KL(π_S ‖ π_T) that this codebase's OPD uses in place of the
paper's full-vocabulary KL), with the same PPO-clipped loss; verifier rewards are logged, not
trained on. Which rows get x^R (PROPOSAL, the paper says not): among the rows of prompts with a
golden negative, every prompt's first row, then every prompt's second, and so on
(`teacher_reflective_rows`). Extra metrics: `reflect/teacher_gap_mean` (mean d_t),
`reflect/teacher_rows_reflective` (K^batch / B as realised).
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.losses.reflect_rl import TRANSITION_FRACTION
from jaxrl_post.methods.grpo import (
  global_records,
  policy_objective,
  policy_runtime,
  sample_groups,
  score_rollout,
  step_record,
  task_loader,
  verify_groups,
)
from jaxrl_post.methods.opd import load_teachers
from jaxrl_post.methods.opd_family import check_teacher_vocabulary, locate_teacher
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup

TEMPLATE_FIELDS = ("prompt", "negative")
SLIP_CHOICES = ("first", "random")
MODES = ("rlvr", "opd")  # Eq. 9 (mixed prompt groups) / Eq. 11 (teacher under x^R)
# Reflective prompts checked against `config.prompt_len` at start-up (step 1 would fail
# anyway, but after the step-0 evaluation has compiled).
PROMPT_CHECK_EXAMPLES = 64

NegativeFn = Callable[[Mapping[str, Any]], "str | None"]


# ---- configuration ----


def check_template(template: str) -> None:
  """`config.reflect.template` must name exactly the fields {prompt} and {negative}.

  Raises:
    ValueError: naming the key, for a missing, unknown or positional field.

  Examples:
    >>> check_template("{prompt}Wrong:\\n{negative}\\nFix it:\\n")
    >>> check_template("{prompt} {answer}")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: config.reflect.template=... it has {prompt}, {answer}
  """
  try:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
  except ValueError as e:
    raise ValueError(f"config.reflect.template={template!r}: {e}") from None
  if sorted(set(fields)) != sorted(TEMPLATE_FIELDS):
    listed = ", ".join("{" + f + "}" for f in fields) or "none"
    raise ValueError(f"config.reflect.template={template!r} must use exactly the fields "
                     f"{{prompt}} and {{negative}}; it has {listed}")


def transition_steps(config) -> int:
  """t_trans: `config.reflect.transition_steps`, or 60 % of `config.steps` when unset (None;
  PROPOSAL, the paper gives none)."""
  value = config.reflect.transition_steps
  if value is None:
    return int(round(TRANSITION_FRACTION * config.steps))
  return int(value)


def validate_reflect(config) -> None:
  """Checks `config.reflect` before anything is built; errors name the key.

  Raises:
    ValueError: an unknown kernel (listing the known ones), p_h / p_l outside [0, 1], a
      negative warm-up or transition, a template without {prompt} and {negative}, a
      non-positive token budget, an unknown slip choice or mode, mode "opd" without a teacher.
  """
  r = config.reflect
  if r.kernel not in losses.REFLECT_KERNELS:
    raise ValueError(f"config.reflect.kernel={r.kernel!r}: unknown kernel; known: "
                     f"{', '.join(sorted(losses.REFLECT_KERNELS.names()))}")
  for key in ("p_high", "p_low"):
    if not 0.0 <= float(r[key]) <= 1.0:
      raise ValueError(f"config.reflect.{key}={r[key]} must be in [0, 1]")
  if r.warmup_steps < 0:
    raise ValueError(f"config.reflect.warmup_steps={r.warmup_steps} must be >= 0")
  if transition_steps(config) < 0:
    raise ValueError(f"config.reflect.transition_steps={r.transition_steps} must be >= 0")
  check_template(r.template)
  if r.negative_tokens <= 0 or not 0 <= r.negative_head <= r.negative_tokens:
    raise ValueError(f"config.reflect.negative_tokens={r.negative_tokens} must be > 0 and "
                     f"config.reflect.negative_head={r.negative_head} in [0, negative_tokens]")
  if r.slip not in SLIP_CHOICES:
    raise ValueError(f"config.reflect.slip={r.slip!r}: known: {', '.join(SLIP_CHOICES)}")
  if r.mode not in MODES:
    raise ValueError(f"config.reflect.mode={r.mode!r}: known: {', '.join(MODES)}")
  if r.mode == "opd" and not r.teacher:
    raise ValueError("config.reflect.mode='opd' needs a teacher: set config.reflect.teacher="
                     "<checkpoint directory>")


class Schedule(NamedTuple):
  """One step's reflective share: g(t) and K_t of N rollouts per prompt."""

  fraction: float
  count: int


def schedule(config, step: int) -> Schedule:
  """g(t) and K_t = round(N g(t)) at `step` from `config.reflect` (Eq. 7, `losses`).

  Examples:
    >>> import ml_collections
    >>> c = ml_collections.ConfigDict(dict(steps=10, group_size=8, reflect=dict(
    ...   kernel="cosine", p_high=0.5, p_low=0.0, warmup_steps=0, transition_steps=None)))
    >>> [tuple(schedule(c, s)) for s in (0, 3, 6)]   # t_trans = 60 % of 10 steps
    [(0.5, 4), (0.25, 2), (0.0, 0)]
  """
  r = config.reflect
  g = float(losses.reflective_fraction(
    step, total_steps=config.steps, kernel=r.kernel, warmup_steps=r.warmup_steps,
    transition_steps=transition_steps(config), p_high=r.p_high, p_low=r.p_low))
  return Schedule(round(g, 7), losses.reflective_count(config.group_size, g))


# ---- golden negatives (offline) ----


class JsonlNegatives:
  """Golden negatives from a JSONL file, `{"prompt": q, "negative": o⁻}` per line (the
  OpenR1-GNT layout), looked up by the record's exact prompt text.

  A prompt listed twice keeps its first negative (PROPOSAL: a fixed o⁻ per problem, as in
  the paper's offline data set). Prompts not in the file have no negative (all direct).

  Raises:
    ValueError: a missing file (naming `config.reflect.negatives_path`) or a malformed line
      (naming the file and the line).
  """

  def __init__(self, path: str | Path):
    self.path = Path(path).expanduser()
    if not self.path.is_file():
      raise ValueError(f"config.reflect.negatives_path={str(path)!r}: no such file")
    self.table: dict[str, str] = {}
    with self.path.open(encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          item = json.loads(line)
          prompt, negative = item["prompt"], item["negative"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
          raise ValueError(f"{self.path}:{number}: expected a JSON object with 'prompt' and "
                           f"'negative' ({e!r})") from None
        if not isinstance(prompt, str) or not isinstance(negative, str):
          raise ValueError(f"{self.path}:{number}: 'prompt' and 'negative' must be strings")
        self.table.setdefault(prompt, negative)

  def __len__(self) -> int:
    return len(self.table)

  def __call__(self, record: Mapping[str, Any]) -> str | None:
    return self.table.get(str(record["prompt"]))


class TaskNegatives:
  """Golden negatives from the task itself (`task.golden_negative(record, seed=)`).

  `slip="first"` drops the first carry; "random" one chosen by a seed of (`seed`, the
  record's index), so a problem keeps the same negative all run long.
  """

  def __init__(self, task, *, slip: str = "first", seed: int = 0):
    if not callable(getattr(task, "golden_negative", None)):
      raise ValueError(f"config.reflect.negatives_path is empty and task {task.name!r} has no "
                       f"golden_negative(record); give a JSONL file of golden negatives")
    self.task, self.slip, self.seed = task, slip, int(seed)

  def __call__(self, record: Mapping[str, Any]) -> str | None:
    seed = None
    if self.slip == "random":
      seed = int(np.random.SeedSequence([self.seed, int(record["index"])]).generate_state(1)[0])
    return self.task.golden_negative(record, seed=seed)


def negative_source(config, task) -> NegativeFn:
  """`record -> o⁻ | None` from `config.reflect.negatives_path` ('' = the task's own)."""
  path = config.reflect.negatives_path
  if path:
    return JsonlNegatives(path)
  return TaskNegatives(task, slip=config.reflect.slip, seed=config.seed)


# ---- prompts ----


def fit_negative(tokenizer, negative: str, budget: int, head: int) -> str:
  """o⁻ cut to `budget` tokens (`losses.truncate_negative`), back as text."""
  tokens = tokenizer.encode(negative)
  if len(tokens) <= budget:
    return negative
  return tokenizer.decode(losses.truncate_negative(tokens, budget, head=head))


def reflective_prompt(template: str, prompt: str, negative: str) -> str:
  """x^R(q, o⁻): the template filled in.

  Examples:
    >>> reflective_prompt("{prompt}Wrong:\\n{negative}\\nFix:\\n", "Q: 1+9=\\n", "#### 0")
    'Q: 1+9=\\nWrong:\\n#### 0\\nFix:\\n'
  """
  return template.format(prompt=prompt, negative=negative)


class StepPrompts(NamedTuple):
  """The rows of one step: N per record, record-major, the first K of a group reflective.

  Attributes:
    prompts: `rows` prompt strings (x^R or x^D).
    reflective: bool `[rows]`, True where the row's prompt is x^R.
    group_ids: int32 `[rows]`, the record of each row (one group per record).
    has_negative: bool `[records]`.
  """

  prompts: list[str]
  reflective: np.ndarray
  group_ids: np.ndarray
  has_negative: np.ndarray


def step_prompts(records: Sequence[Mapping[str, Any]], negatives: Sequence[str | None], *,
                 group_size: int, count: int, template: str, tokenizer=None,
                 prompt_len: int | None = None) -> StepPrompts:
  """Per record `group_size` rows: the first `count` use x^R (when the record has a negative,
  else none does), the rest x^D; `losses.reflective_rows` places them.

  With `tokenizer` and `prompt_len`, a reflective prompt longer than `prompt_len` tokens
  raises a ValueError naming `config.prompt_len`.

  Examples:
    >>> p = step_prompts([{"prompt": "a"}, {"prompt": "b"}], ["x", None], group_size=3,
    ...                  count=2, template="{prompt}|{negative}")
    >>> p.prompts, p.reflective.astype(int).tolist(), p.group_ids.tolist()
    (['a|x', 'a|x', 'a', 'b', 'b', 'b'], [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1])
  """
  has_negative = np.asarray([n is not None for n in negatives], bool)
  group_ids = np.repeat(np.arange(len(records), dtype=np.int32), group_size)
  reflective = losses.reflective_rows(group_ids, count) & has_negative[group_ids]
  direct = [str(r["prompt"]) for r in records]
  reflected = [None] * len(records)
  for g in np.unique(group_ids[reflective]).tolist():
    reflected[g] = reflective_prompt(template, direct[g], negatives[g])
    if tokenizer is not None and prompt_len is not None:
      check_prompt_fits(tokenizer, reflected[g], prompt_len)
  prompts = [reflected[g] if reflective[row] else direct[g]
             for row, g in enumerate(group_ids.tolist())]
  return StepPrompts(prompts, reflective, group_ids, has_negative)


def teacher_reflective_rows(group_ids: Sequence[int] | np.ndarray, has_negative: np.ndarray,
                            count: int) -> np.ndarray:
  """bool `[rows]`: the K^batch = `count` rows the OPD teacher scores under x^R (Eq. 11).

  Only rows of prompts with a negative qualify; they are taken spread over those prompts
  (each one's first row, then each one's second, ...; PROPOSAL), at most all of them.

  Examples:
    >>> rows = teacher_reflective_rows([0, 0, 1, 1, 2, 2], np.array([True, False, True]), 3)
    >>> rows.astype(int).tolist()
    [1, 1, 0, 0, 1, 0]
  """
  group_ids = np.asarray(group_ids)
  seen: dict[int, int] = {}
  position = np.zeros(group_ids.shape, np.int64)
  for i, g in enumerate(group_ids.tolist()):
    position[i] = seen.get(g, 0)
    seen[g] = position[i] + 1
  candidates = np.flatnonzero(np.asarray(has_negative, bool)[group_ids])
  order = candidates[np.lexsort((group_ids[candidates], position[candidates]))]
  out = np.zeros(group_ids.shape, bool)
  out[order[:max(int(count), 0)]] = True
  return out


def check_prompt_fits(tokenizer, prompt: str, prompt_len: int) -> None:
  """A ValueError naming `config.prompt_len` when `prompt` has more tokens than that."""
  n = len(tokenizer.encode(prompt))
  if n > prompt_len:
    raise ValueError(f"a reflective prompt has {n} tokens, more than config.prompt_len="
                     f"{prompt_len}; raise config.prompt_len or lower "
                     f"config.reflect.negative_tokens (the golden negative's budget)")


def reward_split(correct: np.ndarray, reflective: np.ndarray,
                 group_ids: np.ndarray) -> dict[str, float]:
  """Mean correctness of reflective and direct rows, and Δ_ref paired over the groups that
  have both (NaN where a mean has no rows; NaN rewards — failed verifiers — are left out).

  Examples:
    >>> r = reward_split(np.array([1., 1., 0., 0., 1., 0.]),
    ...                  np.array([1, 1, 0, 0, 0, 0], bool), np.array([0, 0, 0, 1, 1, 1]))
    >>> {k: round(v, 4) for k, v in r.items()}
    {'reflect/reward_reflective': 1.0, 'reflect/reward_direct': 0.25, 'reflect/delta_ref': 1.0}
  """
  correct = np.asarray(correct, np.float64)

  def mean(mask) -> float:
    values = correct[mask]
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")

  deltas = []
  for g in np.unique(group_ids):
    rows = group_ids == g
    d = mean(rows & reflective) - mean(rows & ~reflective)
    if not np.isnan(d):
      deltas.append(d)
  return {"reflect/reward_reflective": mean(reflective),
          "reflect/reward_direct": mean(~reflective),
          "reflect/delta_ref": float(np.mean(deltas)) if deltas else float("nan")}


# ---- the method ----


class ReflectRL:
  """ReflectRL on `config.task` (configs/reflect_rl.py); a `training.loop.Method`."""

  name = "reflect_rl"

  def __init__(self, config):
    validate_reflect(config)
    self.config = config
    self.updates_per_step = config.ppo_epochs * config.ppo_mini_batches
    self.data_iter = None
    self.teacher_start = None

  # ---- set-up ----

  def build_model(self, run: loop.Run):
    config = self.config
    self.task, self.tokenizer, _, model = run_setup.build_run(
      config, str(run.workdir), run.train_mesh, run.train_rules)
    self.objective = policy_objective(config)
    self.loss_fn = self.objective.loss_fn
    # The golden-negative source and the prompt budget fail here, before anything compiles.
    self.negative_fn = negative_source(config, self.task)
    self.check_prompt_budget()
    self.teacher_start = None
    if config.reflect.mode == "opd":
      what = "config.reflect.teacher"
      self.teacher_start = locate_teacher(config.reflect.teacher, what)
      check_teacher_vocabulary(self.teacher_start, what=what,
                               vocab_size=model.config.vocab_size, tokenizer=config.tokenizer)
    self.model = model
    return model

  def check_prompt_budget(self) -> None:
    """The reflective prompts of the first train examples fit `config.prompt_len`."""
    config = self.config
    count = min(PROMPT_CHECK_EXAMPLES, config.num_train_examples)
    records = [self.task.make_example("train", i) for i in range(count)]
    step_prompts(records, self.negatives(records), group_size=1, count=1,
                 template=config.reflect.template, tokenizer=self.tokenizer,
                 prompt_len=config.prompt_len)

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    # The scorer gives old-policy log-probs on the trainer's mesh, each row under the prompt
    # it was sampled from.
    self.runtime = policy_runtime(run, config, self.model, self.tokenizer, self.task,
                                  self.loss_fn)
    self.step_fn, self.sampler, self.scorer, self.evaluator = self.runtime
    # As GRPO: a frozen reference only when the KL term is on (the paper's KL coef is 0).
    self.reference = (jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None)
    self.teacher = None
    if self.teacher_start is not None:  # Eq. 11: frozen, in the trainer's layout
      try:
        (self.teacher,) = load_teachers([self.teacher_start], state, mesh=run.train_mesh,
                                        rules=run.train_rules)
      except ValueError as e:
        raise ValueError(f"config.reflect.teacher: {e}") from None
    self.data_iter = iter(task_loader(config, self.task, config.prompts_per_step))
    self.rng = jax.random.key(config.seed + 1)

  # ---- the method's own state ----

  def state_dict(self) -> dict[str, Any]:
    # Negatives are a function of the record and the schedule of the step: the data position
    # is all a restart needs.
    return {"data": self.data_iter.get_state()}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "data" in state and self.data_iter is not None:
      self.data_iter.set_state(state["data"])

  # ---- one step ----

  def negatives(self, records) -> list[str | None]:
    r = self.config.reflect
    out = []
    for record in records:
      negative = self.negative_fn(record)
      out.append(None if negative is None else fit_negative(
        self.tokenizer, negative, r.negative_tokens, r.negative_head))
    return out

  def put(self, tree):
    return put_batch(tree, self.run.train_mesh, self.run.train_rules)

  def score(self, params, inputs) -> jax.Array:
    return self.scorer.score(params, **inputs, temperature=self.config.temperature,
                             num_micro_batches=self.config.score_micro_batches).logp

  def rollout(self, state, records, rows: StepPrompts, step: int, timings: dict[str, float]):
    """The step's rows, sampled with the sampler's copy of the policy; `group_ids` = records."""
    config = self.config
    rng = jax.random.fold_in(self.rng, step)
    if rows.reflective.any():
      rollout = sample_groups(self.runtime, state.params, rows.prompts, config, rng, timings,
                              n_samples=1)
    else:
      # Direct only (late steps; the p_h = 0 baseline): GRPO's call, each prompt prefilled
      # once for its N samples, so the baseline arm samples exactly as experiments/grpo.py.
      rollout = sample_groups(self.runtime, state.params, [str(r["prompt"]) for r in records],
                              config, rng, timings)
    return rollout.replace(group_ids=jnp.asarray(rows.group_ids))

  def teacher_logp(self, records, negatives, rows: StepPrompts, batch, count: int):
    """Eq. 11: the teacher's log-probs of the student's tokens, under x^R(q, o⁻) for
    K^batch = `count` rows (`teacher_reflective_rows`) and under x^D for the others."""
    config = self.config
    reflective = teacher_reflective_rows(rows.group_ids, rows.has_negative, count)
    prompts = []
    for row, g in enumerate(rows.group_ids.tolist()):
      prompt = str(records[g]["prompt"])
      if reflective[row]:
        prompt = reflective_prompt(config.reflect.template, prompt, negatives[g])
        check_prompt_fits(self.tokenizer, prompt, config.prompt_len)
      prompts.append(prompt)
    prepared = self.scorer.prepare(prompts)
    tokens, mask = multihost.to_host((prepared.tokens, prepared.mask))
    inputs = self.put(dict(prompt_tokens=tokens[:len(prompts)], prompt_mask=mask[:len(prompts)],
                           completion_tokens=batch["completion_tokens"],
                           completion_mask=batch["completion_mask"]))
    return np.asarray(multihost.to_host(self.score(self.teacher, inputs)), np.float32), reflective

  def step(self, state, step: int):
    config = self.config
    opd = config.reflect.mode == "opd"
    timings: dict[str, float] = {}
    records = global_records(self.data_iter)

    # 1-2. RLVR: K_t reflective rows per prompt with a golden negative, the rest direct.
    # OPD: the student samples from x^D only.
    fraction, count = schedule(config, step)
    negatives = self.negatives(records)
    rows = step_prompts(records, negatives, group_size=config.group_size,
                        count=0 if opd else count, template=config.reflect.template,
                        tokenizer=self.tokenizer, prompt_len=config.prompt_len)
    rollout = self.rollout(state, records, rows, step, timings)

    # 3. Verifier rewards on the answer; Â over the whole mixed group (Eq. 9).
    verified = verify_groups(self.objective, self.task, records,
                             self.sampler.decode_text(rollout), rollout.group_ids, config)

    # 4. Old policy (and reference) on the trainer's mesh, each row under its own prompt.
    batch, old_logp = score_rollout(self.runtime, config, self.put, state.params, rollout,
                                    verified.adv, timings, reference=self.reference)
    record: dict[str, Any] = {}
    if opd:
      # Eq. 11: K^batch = round(B g(t)) rows scored by the teacher under x^R; d_t as advantage.
      tic = time.perf_counter()
      teacher_count = losses.reflective_count(len(rows.prompts), fraction)
      teacher, teacher_rows = self.teacher_logp(records, negatives, rows, batch, teacher_count)
      mask = batch["completion_mask"]
      gap = np.asarray(losses.sampled_token_opd_reward(batch["old_logp"], teacher, mask))
      batch["adv"] = gap
      count = teacher_count
      record.update({"reflect/teacher_gap_mean": float(gap.sum() / max(mask.sum(), 1)),
                     "reflect/teacher_rows_reflective": float(teacher_rows.mean())})
      timings["time/teacher"] = time.perf_counter() - tic

    # 5. The PPO phase.
    tic = time.perf_counter()
    state, updates = ppo.ppo_phase(
      self.step_fn, state, batch, epochs=config.ppo_epochs, mini_batches=config.ppo_mini_batches,
      rng=np.random.default_rng([config.seed, step]), put=self.put)
    timings["time/update"] = time.perf_counter() - tic

    record.update(step_record(updates, rollout, old_logp, verified, batch["completion_mask"],
                              timings))
    record.update(reward_split(verified.correct, rows.reflective, rows.group_ids))
    record.update({"reflect/fraction": fraction, "reflect/count": count,
                   "reflect/prompts_with_negative": float(rows.has_negative.mean()),
                   "reflect/rows_reflective": float(rows.reflective.mean())})
    return state, record

  # ---- evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, float]:
    # Direct prompts only: the inference interface is the task's, unchanged.
    return self.evaluator(state.params, step)

  def progress(self, record):
    return {"reward": record["train/reward_correct"], "K": record["reflect/count"]}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    return loop.eval_summary(records, "eval/accuracy", "reflect_rl: held-out accuracy")
