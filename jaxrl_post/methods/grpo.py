"""GRPO-family RL on a verifiable task: prompts → rollouts → rewards → advantages → PPO phase.

The policy loss, the advantage estimator and the KL term are picked by name in the config
(`config.loss.name` from `losses.POLICY_LOSSES`, `config.advantage` from
`advantages.ADVANTAGES`, `config.loss.beta`), so GRPO (arXiv 2402.03300), Dr.GRPO
(2503.20783), DAPO's token-mean (2503.14476), GSPO (2507.18071), CISPO, SAPO, RLOO and the
rest are this one method with different names. One step:

  1. `prompts_per_step` prompts from this process's data shards, gathered into the global batch;
  2. `group_size` completions each from the sampler (its own mesh or the trainer's);
  3. the task's verifier rewards them (`rewards.verifiers.rewards_for`), weighted over
     `config.reward_weights`, and the advantage estimator turns rewards into `adv` `[rows]`;
  4. the trainer scores the old policy (and the frozen reference when β > 0) on its own mesh;
  5. `ppo_epochs × ppo_mini_batches` updates (`training.ppo.ppo_phase`).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.methods import group_source, step_parts
from jaxrl_post.models.lora import merge_adapters, without_lora
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.rewards.overlong import overlong_penalty, overlong_window
from jaxrl_post.rewards.pertmind import build_pertmind
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import Sampler, rollout_metrics
from jaxrl_post.sampling import grammar as grammar_lib
from jaxrl_post.tasks import data as task_data
from jaxrl_post.tasks.base import get_task
from jaxrl_post.training import async_rollouts, loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.evaluation import evaluate
from jaxrl_post.training.metrics import write_eval_outcomes
from jaxrl_post.training.objectives import make_policy_loss
from jaxrl_post.training.train_state import make_train_step

ROLLOUT_KEYS = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask")


def global_records(data_iter, keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """The step's global batch of records on every process (each process read its own shards).

  The loader yields this process's columns; they become records and are concatenated across
  processes in process order (`multihost.allgather_records`).
  """
  columns = next(data_iter)
  keys = list(columns) if keys is None else list(keys)
  local = [{k: columns[k][i] for k in keys} for i in range(len(columns[keys[0]]))]
  return multihost.allgather_records(local)


class PolicyObjective(NamedTuple):
  """What a GRPO-family method's config picks: the loss, the advantage and the reward weights."""

  loss_fn: Any  # (model, batch) -> (loss, aux), `training.objectives.make_policy_loss`
  advantage_fn: Any  # `advantages.ADVANTAGES` entry
  reward_names: list[str]  # the columns of the reward matrix, `config.reward_weights`' keys
  reward_weights: jax.Array  # float32[len(reward_names)]
  # `config.advantage_token_weighted`: the estimator weighs each row by its completion length
  # (`token_counts`, e.g. REINFORCE++'s token-level whitening as verl does it).
  token_weighted: bool = False


# `config.loss` keys of the sampler-mismatch correction (`losses.sampler_importance_weights`).
SAMPLER_CORRECTION_KEYS = ("sampler_correction", "sampler_level", "sampler_min", "sampler_max")


def uses_sampler_correction(config) -> bool:
  """Whether `config.loss.sampler_correction` asks for TIS / IcePop on the sampler's log-probs
  (absent or "none": no)."""
  return config.loss.get("sampler_correction", "none") != "none"


def policy_objective(config, **loss_extra) -> PolicyObjective:
  """`config.loss` / `config.advantage` / `config.reward_weights` → a `PolicyObjective`.

  Checked here, before anything compiles: the loss and advantage names (a ValueError naming
  the config keys), that `ppo_mini_batches × num_micro_batches` divides the step's
  `prompts_per_step × group_size` rollouts, and the reward names of `config.reward_weights`
  ("correct", "format", "overlong", the columns `verify_groups` fills; "overlong" also needs a
  valid `config.overlong`, `rewards.overlong`).
  `loss_extra` goes to `make_policy_loss` (e.g. a method's `logits_transform`).
  """
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  if not uses_sampler_correction(config):  # the loss's own defaults: no correction
    loss_kwargs = {k: v for k, v in loss_kwargs.items() if k not in SAMPLER_CORRECTION_KEYS}
  # Dr.GRPO's fixed denominator is the generation budget, not the (trimmed) width.
  loss_kwargs.setdefault("max_tokens", config.max_new_tokens)
  try:
    loss_fn = make_policy_loss(policy_loss=config.loss.name, temperature=config.temperature,
                               **loss_extra, **loss_kwargs)
    advantage_fn = advantages_lib.ADVANTAGES.get(config.advantage)
  except KeyError as e:
    raise ValueError(f"config.loss.name / config.advantage: {e}") from None
  rollouts = config.prompts_per_step * config.group_size
  if rollouts % (config.ppo_mini_batches * config.num_micro_batches):
    raise ValueError(f"config.ppo_mini_batches ({config.ppo_mini_batches}) × "
                     f"config.num_micro_batches ({config.num_micro_batches}) must divide the "
                     f"{rollouts} rollouts per step (prompts_per_step × group_size)")
  names = list(config.reward_weights)
  columns = ("correct", "format", "overlong")
  unknown = [k for k in names if k not in columns]
  if unknown or not names:
    raise ValueError(f"config.reward_weights={dict(config.reward_weights)}: unknown reward(s) "
                     f"{unknown}; valid names: {', '.join(columns)} (at least one)")
  if "overlong" in names:
    overlong_window(config)  # a missing or bad config.overlong fails here, not mid-run
  weights = jnp.asarray([config.reward_weights[k] for k in names], jnp.float32)
  token_weighted = bool(config.get("advantage_token_weighted", False))
  if token_weighted and "token_counts" not in inspect.signature(advantage_fn).parameters:
    raise ValueError(f"config.advantage_token_weighted=True: config.advantage="
                     f"{config.advantage!r} takes no token_counts (reinforce_pp and "
                     "reinforce_pp_baseline do)")
  return PolicyObjective(loss_fn, advantage_fn, names, weights, token_weighted)


def task_grammar(config, task, tokenizer) -> grammar_lib.TokenGrammar | None:
  """`config.constrained_decoding` (optional, default False): the task's completion grammar
  (`Task.grammar_slots`, `sampling.grammar.from_slots`), for legal-token decoding
  (PertMind, arXiv 2608.16419; RecoverFly, 2608.09467). None when off.

  Raises:
    ValueError: naming `config.constrained_decoding` when the task has no grammar.
  """
  if not config.get("constrained_decoding", False):
    return None
  slots = task.grammar_slots() if hasattr(task, "grammar_slots") else None
  if slots is None or tokenizer is None:
    raise ValueError(f"config.constrained_decoding=True but task {config.task!r} has no "
                     "completion grammar (Task.grammar_slots) or the run no tokenizer")
  return grammar_lib.from_slots(tokenizer, slots)


def grammar_loss_extra(grammar) -> dict[str, Any]:
  """`make_policy_loss` arguments that mask the loss's logits with `grammar` (the batch's
  `grammar_state` per position, chunk by chunk: `sampling.grammar.logits_transform`)."""
  if grammar is None:
    return {}
  return dict(logits_transform=grammar_lib.logits_transform(grammar),
              transform_keys=("grammar_state",))


def train_examples(config, task) -> int:
  """How many train records a run draws from: `config.num_train_examples`, checked against the
  task's train split (0 = all of it).

  Raises:
    ValueError: naming `config.num_train_examples` when the split is smaller, or when it is 0
      for a generated task, which has no size of its own.
  """
  requested, available = config.num_train_examples, task.num_examples("train")
  if requested < 0:
    raise ValueError(f"config.num_train_examples={requested} must be >= 0")
  if available is None:
    if requested == 0:
      raise ValueError(f"config.num_train_examples=0 (all rows) needs a task with a fixed train "
                       f"split; task {config.task!r} is generated: give a count")
    return requested
  if requested > available:
    raise ValueError(f"config.num_train_examples={requested} but task {config.task!r} has "
                     f"{available} train rows; use 0 for all of them")
  return requested or available


# What a run does with dataset prompts longer than `config.prompt_len` tokens.
LONG_PROMPT_POLICIES = ("error", "drop")


def fitting_indices(config, task, tokenizer, split: str, count: int, key: str) -> list[int]:
  """The indices of the first examples of `split` whose prompts fit `config.prompt_len`.

  A task with a fixed split (a dataset file) is checked at start-up, so that one long problem
  cannot stop a run hours in (the sampler refuses prompts longer than its largest bucket):
  `config.long_prompts="error"` (the default) raises, naming the longest prompt; `"drop"`
  skips the long ones (logged) and takes the next that fit, up to `count`. Generated tasks are
  not checked (their prompts are short by construction; the sampler still refuses a long one).

  Raises:
    ValueError: naming `config.prompt_len` / `config.long_prompts` and `key`.
  """
  policy = config.get("long_prompts", "error")
  if policy not in LONG_PROMPT_POLICIES:
    raise ValueError(f"config.long_prompts={policy!r}; valid: {', '.join(LONG_PROMPT_POLICIES)}")
  available = task.num_examples(split)
  if available is None or tokenizer is None:
    return list(range(count))
  limit = config.prompt_len
  candidates = range(available) if policy == "drop" else range(count)
  keep, longest = [], (0, -1)
  for i in candidates:
    length = len(tokenizer.encode(task.make_example(split, i)["prompt"]))
    if length <= limit:
      keep.append(i)
      if len(keep) == count:
        break
    else:
      longest = max(longest, (length, i))
  if policy == "error" and longest[1] >= 0:
    raise ValueError(
      f"{key}: example {longest[1]} of split {split!r} has a {longest[0]}-token prompt, longer "
      f"than config.prompt_len={limit}: raise config.prompt_len, or set "
      "config.long_prompts='drop' to skip such prompts")
  if len(keep) < count:
    raise ValueError(f"{key}: only {len(keep)} of the {split!r} prompts fit "
                     f"config.prompt_len={limit}, fewer than the {count} needed")
  skipped = keep[-1] + 1 - len(keep) if keep else 0
  if skipped:
    logging.warning("%s: skipped %d %r prompts longer than config.prompt_len=%d", key, skipped,
                    split, limit)
  return keep


def task_loader(config, task, batch_size: int, tokenizer=None) -> task_data.ShardedLoader:
  """The train split of `task`, `batch_size` records per step in all, read in
  `config.data_shards` logical shards of which this process reads its own.

  `config.num_train_examples` of 0 takes every row of a task with a fixed train split (a
  dataset file); a generated task needs a count. With the `tokenizer`, a fixed split's prompts
  are checked against `config.prompt_len` (`fitting_indices`).
  """
  count = train_examples(config, task)
  indices = fitting_indices(config, task, tokenizer, "train", count, "config.task")
  source = task_data.TaskSource(task, "train", count, indices=indices)
  return task_data.ShardedLoader(source, global_batch_size=batch_size,
                                 num_shards=config.data_shards, seed=config.seed)


def _test_records(config, task, tokenizer, key: str) -> list[dict]:
  """The first `config.eval_examples` test records of `task` whose prompts fit, checked
  against a fixed split's size (`fitting_indices`)."""
  count, available = config.eval_examples, task.num_examples("test")
  if count < 0:
    raise ValueError(f"config.eval_examples must be >= 0 (0: no held-out evaluation); got "
                     f"{count}")
  if count == 0:
    return []
  if available is not None and count > available:
    raise ValueError(f"config.eval_examples={count} but {key} ({getattr(task, 'name', task)!r}) "
                     f"has {available} test examples")
  indices = fitting_indices(config, task, tokenizer, "test", count, key)
  return [task.make_example("test", i) for i in indices]


class TaskEvaluator:
  """Held-out greedy accuracy, mean@n and unbiased pass@k on `config.eval_examples` prompts.

  The metrics are `training.evaluation.evaluate`'s, the function experiments/evaluate.py calls
  too, so a checkpoint scores the same in the run and offline: `eval/accuracy` (greedy),
  `eval/format`, `eval/sample_accuracy` (mean@n), `eval/pass_at_{k}`, each with its standard
  error over prompts (`…_se`), and `eval/verifier_errors` / `eval/verifier_timeouts`.

  `config.eval_examples = 0` turns held-out evaluation off: the call returns no metrics and
  writes no outcomes (the loop still calls it at step 0 and at the last step).

  n, the sampled completions per prompt, is `pass_k` (the binaries pass `config.eval_pass_k`)
  unless the optional `config.eval_samples` is set; the pass@k reported are `(n,)` (any of the
  n correct) unless the optional `config.eval_pass_ks` lists other k ≤ n.

  Decodes with the sampler's layout of the parameters (`reshard_state`: in place when
  colocated, a copy when the sampler has devices of its own), and writes the per-prompt
  outcomes to `workdir/eval_outcomes/` so that two steps compare pairwise
  (`training.evaluation.paired_gain`).

  `config.eval_tasks` (optional) names other tasks to evaluate greedily on the same number of
  prompts — capabilities the run should retain, not train on — as `{name: {"task": registered
  name, "task_knobs": {...}}}`; they log `eval/<name>/accuracy` and their per-prompt outcomes
  as `greedy_correct/<name>`.
  """

  def __init__(self, run: loop.Run, task, sampler: Sampler, *, max_new_tokens: int,
               pass_k: int, temperature: float = 1.0, timeout_s: float | None = None):
    self.run, self.task, self.sampler = run, task, sampler
    config = run.config
    self.records = _test_records(config, task, sampler.tokenizer, "config.task")
    self.extra = {}
    for name, spec in (config.get("eval_tasks") or {}).items():
      try:
        other = get_task(spec["task"], **dict(spec.get("task_knobs") or {}))
      except (KeyError, TypeError) as e:
        raise ValueError(f"config.eval_tasks.{name}: {e}") from None
      # The same prompt rendering as the trained task (a chat template, when the run has one).
      other = run_setup.chat_prompts(config, other, sampler.tokenizer)
      self.extra[name] = (other, _test_records(config, other, sampler.tokenizer,
                                               f"config.eval_tasks.{name}"))
    self.rows_per_call = int(config.get("eval_rows_per_call") or 0) or None
    self.max_new_tokens = max_new_tokens
    self.pass_k = int(config.get("eval_samples") or pass_k)
    pass_ks = config.get("eval_pass_ks") or None
    self.pass_ks = None if pass_ks is None else tuple(int(k) for k in pass_ks)
    if self.pass_ks and max(self.pass_ks) > self.pass_k:
      raise ValueError(f"config.eval_pass_ks={list(self.pass_ks)} needs k <= n, the samples "
                       f"per prompt (config.eval_samples or config.eval_pass_k): {self.pass_k}")
    self.temperature, self.timeout_s = temperature, timeout_s

  def sampler_params(self, params):
    """`(params in the sampler's layout, seconds)`; a LoRA run's adapters merged into the
    frozen base first (`models.lora.merge_adapters`): the sampler runs the base graph, so it
    decodes as fast as the base model."""
    placement = self.run.placement
    frozen = getattr(self.run, "frozen", None)
    merge_s = 0.0
    if frozen is not None:
      tic = time.perf_counter()
      params = jax.block_until_ready(merge_adapters(params, frozen))
      merge_s = time.perf_counter() - tic
    params, seconds = reshard_state(params, placement.sample_mesh, placement.sample_rules)
    return params, seconds + merge_s

  def __call__(self, params, step: int) -> dict[str, float]:
    if not self.records:
      return {}
    params = self.sampler_params(params)[0]
    evaluation = evaluate(self.sampler, params, self.task, self.records,
                          max_new_tokens=self.max_new_tokens, k=self.pass_k,
                          temperature=self.temperature, rng=jax.random.key(step),
                          timeout_s=self.timeout_s, pass_ks=self.pass_ks,
                          rows_per_call=self.rows_per_call)
    metrics = {f"eval/{k}": v for k, v in evaluation.metrics.items() if k != "num_problems"}
    outcomes = {"greedy_correct": evaluation.greedy_correct,
                "sample_correct": evaluation.sample_correct}
    for name, (task, records) in self.extra.items():
      other = evaluate(self.sampler, params, task, records, max_new_tokens=self.max_new_tokens,
                       k=0, timeout_s=self.timeout_s, rows_per_call=self.rows_per_call)
      metrics[f"eval/{name}/accuracy"] = other.metrics["accuracy"]
      outcomes[f"greedy_correct/{name}"] = other.greedy_correct
    write_eval_outcomes(self.run.workdir, step, **outcomes)
    return metrics


class PolicyRuntime(NamedTuple):
  """The compiled pieces every GRPO-family method starts with (`policy_runtime`)."""

  step_fn: Any  # `make_train_step` of the method's loss on the trainer's mesh
  sampler: Sampler  # rollouts, on the sampler's mesh
  scorer: Sampler  # old-policy / reference / teacher log-probs, on the trainer's mesh
  evaluator: TaskEvaluator  # held-out accuracy with the sampler's layout of the parameters


def policy_runtime(run: loop.Run, config, model, tokenizer, task, loss_fn, *,
                   shared: Sequence[str] = (), grammar=None) -> PolicyRuntime:
  """Builds the train step, the sampler, the scorer and the evaluator of a policy method.

  `shared`: batch keys besides `num_tokens` / `num_sequences` that hold one value for the whole
  mini-batch (a method's global normaliser), not split over micro-batches.

  Old-policy, reference and teacher log-probs are scored by the trainer, on its mesh and in its
  layout: `old_logp` then comes from the same parameters and sharding as the update's forward
  pass (the first PPO ratio is 1 up to float noise), and `rollout/logp_*` measure the
  sampler / trainer mismatch they are meant to.

  In a LoRA run (`run.frozen` set) the step trains the adapters against the frozen base, the
  scorer runs the adapted graph (the update's forward: adapters + `run.frozen`), and the
  sampler the base graph with merged kernels (`TaskEvaluator.sampler_params`).

  `grammar` (`sampling.grammar.TokenGrammar`, `task_grammar`): the sampler, the evaluator and
  the scorer decode / score under it (masked, renormalised log-probs everywhere).
  """
  placement = run.placement
  frozen = getattr(run, "frozen", None)
  step_fn = make_train_step(run.graphdef, loss_fn, run.optimizer,
                            num_micro_batches=config.num_micro_batches,
                            mesh=run.train_mesh, rules=run.train_rules,
                            shared=("num_tokens", "num_sequences", *shared), frozen=frozen)
  sampler = Sampler(model if frozen is None else without_lora(model), tokenizer,
                    max_prompt_len=config.prompt_len, mesh=placement.sample_mesh,
                    rules=placement.sample_rules, grammar=grammar)
  scorer = Sampler(model, tokenizer, max_prompt_len=config.prompt_len, mesh=run.train_mesh,
                   rules=run.train_rules, grammar=grammar)
  evaluator = TaskEvaluator(run, task, sampler, max_new_tokens=config.max_new_tokens,
                            pass_k=config.eval_pass_k, temperature=config.temperature,
                            timeout_s=config.reward_timeout_s)
  return PolicyRuntime(step_fn, sampler, scorer, evaluator)


def sample_groups(runtime: PolicyRuntime, params, prompts: Sequence[str], config, rng,
                  timings: dict[str, float], *, n_samples: int | None = None):
  """`n_samples` (default `config.group_size`) completions per prompt with the sampler's copy
  of `params`; adds `time/reshard` and `time/generate` to `timings`.

  The copy is a re-layout in place when colocated, a device-to-device copy when disaggregated;
  it may alias the trainer's parameters, which the update donates, so it is made afresh each
  step.
  """
  params, timings["time/reshard"] = runtime.evaluator.sampler_params(params)
  tic = time.perf_counter()
  rollout = group_source.generate_rollout(runtime.sampler, params, prompts, config, rng,
                                          n_samples=n_samples)
  rollout.completion_tokens.block_until_ready()
  timings["time/generate"] = time.perf_counter() - tic
  return rollout


class Verified(NamedTuple):
  """A step's verifier outcome (`verify_groups`)."""

  correct: np.ndarray  # float32[rows] 0/1, NaN where the verifier failed
  format: np.ndarray  # float32[rows]
  failures: Any  # `rewards.verifiers.rewards_for`'s error / time-out counts
  adv: jax.Array  # [rows] the advantage estimator's output
  rewards: Any = None  # float32[rows, len(reward_names)] `reward_matrix`, before weighting


def reward_matrix(objective: PolicyObjective, correct, fmt, config, *, lengths=None
                  ) -> np.ndarray:
  """`float32[rows, len(objective.reward_names)]`: one column per reward name.

  "correct" and "format" are the verifier's, "overlong" DAPO's length penalty of `lengths`
  (`[rows]` completion lengths, e.g. the completion mask summed; needed only then) over the
  window of `config.overlong` (`rewards.overlong`). A row whose verifier failed (NaN) gets NaN
  there too, so it stays a row without reward instead of one scored by its length alone.
  """
  columns = {"correct": correct, "format": fmt}
  if "overlong" in objective.reward_names:
    if lengths is None:
      raise ValueError("config.reward_weights names 'overlong': verify_groups needs the "
                       "completion lengths (lengths=[rows])")
    lengths = np.asarray(lengths)
    if lengths.shape != (len(correct),):
      raise ValueError(f"verify_groups: lengths has shape {lengths.shape}, expected "
                       f"({len(correct)},), one per completion")
    max_len, cache_len = overlong_window(config)
    penalty = overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)
    columns["overlong"] = np.where(np.isnan(correct), np.nan, penalty).astype(np.float32)
  return np.stack([columns[k] for k in objective.reward_names], axis=1)


def advantages_of(objective: PolicyObjective, rewards, group_ids, num_groups: int, config, *,
                  lengths=None):
  """`[rows]` advantages of a reward matrix (`reward_matrix`) under `objective`; a
  token-weighted objective needs the completion `lengths` `[rows]`."""
  extra = {}
  if objective.token_weighted:
    if lengths is None:
      raise ValueError("config.advantage_token_weighted=True needs the completion lengths")
    extra["token_counts"] = jnp.asarray(lengths, jnp.float32)
  return objective.advantage_fn(jnp.asarray(rewards), jnp.asarray(group_ids),
                                num_groups=num_groups, eps=config.advantage_eps,
                                reward_weights=objective.reward_weights, **extra)


def verify_groups(objective: PolicyObjective, task, records: Sequence[Mapping[str, Any]],
                  texts: Sequence[str], group_ids, config, *, lengths=None) -> Verified:
  """Verifier rewards of `config.group_size` rows per record (record-major), their reward
  matrix (`reward_matrix`; `lengths` for the "overlong" column) and the advantage
  `objective.advantage_fn` gives them over `group_ids` (`config.reward_weights` weighted)."""
  correct, fmt, failures = rewards_for(task, records, texts, config.group_size,
                                       timeout_s=config.reward_timeout_s)
  rewards = reward_matrix(objective, correct, fmt, config, lengths=lengths)
  adv = advantages_of(objective, rewards, group_ids, len(records), config, lengths=lengths)
  return Verified(correct, fmt, failures, adv, rewards)


def step_record(updates, rollout, old_logp, verified: Verified, completion_mask,
                timings: Mapping[str, float]) -> dict[str, Any]:
  """The metrics every policy step logs: the updates' means (`train/*`), the sampler / trainer
  log-prob agreement (`rollout/*`), rewards, verifier failures, throughput and `timings`."""
  record = {f"train/{k}": v for k, v in ppo.merge_update_metrics(updates).items()}
  record.update({f"rollout/{k}": v for k, v in rollout_metrics(rollout, old_logp).items()})
  tokens = int(np.asarray(completion_mask).sum())
  failures = verified.failures
  record.update({"train/reward_correct": float(np.nanmean(verified.correct)),
                 "train/reward_format": float(np.nanmean(verified.format)),
                 "train/reward_failures": failures.total,
                 "train/reward_errors": failures.errors,
                 "train/reward_timeouts": failures.timeouts,
                 "train/tokens_per_s": tokens / sum(timings.values()), **timings})
  return record


def score_rollout(runtime: PolicyRuntime, config, put, params, rollout, adv,
                  timings: dict[str, float], *, reference=None, old_logp_source="trainer"):
  """The PPO phase's batch: the rollout's rows (trimmed) with `adv`, `old_logp` and, with a
  `reference`, `ref_logp`, scored by the trainer on its mesh (`put` places a host batch there).

  The rollout goes to the host first (it may sit on the sampler's devices, or on other
  processes), then onto the trainer's mesh, rows split over its batch axes. Adds
  `time/score` (and `time/reference`) to `timings`. Returns `(batch, old_logp)`, `old_logp`
  still on the trainer's devices. In a LoRA run `params` and `reference` are adapters, scored
  with the frozen base (`run.frozen`) through the adapted graph, the update's own forward.

  `old_logp_source` (`config.rollout.old_logp`): "trainer" scores the batch with `params`;
  "sampler" (Miles' `--use-rollout-logprobs`) takes the sampler's recorded log-probs instead
  (the policy that sampled: the PPO ratio then measures the whole distance to it, staleness
  included); "detached" leaves `old_logp` out of the batch, and the loss takes its own
  log-probs under `stop_gradient` (`training.objectives.make_policy_loss`; a step of one
  update). The last two skip the scoring pass and return `old_logp` None.
  """
  frozen = getattr(runtime.evaluator.run, "frozen", None)
  tic = time.perf_counter()
  batch = ppo.trim_completions(multihost.to_host(dict(
    {k: getattr(rollout, k) for k in ROLLOUT_KEYS}, adv=adv)), config.trim_completions_to)
  inputs = put({k: batch[k] for k in ROLLOUT_KEYS})
  if runtime.scorer.grammar is not None:
    # The loss's grammar mask (`task_grammar`): each position's automaton state, [rows, time].
    batch["grammar_state"] = np.asarray(grammar_lib.completion_states(
      runtime.scorer.grammar, batch["completion_tokens"], batch["completion_mask"]))

  def score(p):
    p = p if frozen is None else nnx.merge_state(p, frozen)
    return runtime.scorer.score(p, **inputs, temperature=config.temperature,
                                num_micro_batches=config.score_micro_batches).logp

  if old_logp_source == "sampler":
    width = batch["completion_mask"].shape[1]
    batch["old_logp"] = np.asarray(multihost.to_host(rollout.logp), np.float32)[:, :width]
    old_logp = None
  elif old_logp_source == "detached":
    old_logp = None
  else:
    old_logp = score(params)
    batch["old_logp"] = multihost.to_host(old_logp)
  timings["time/score"] = time.perf_counter() - tic
  if reference is not None:
    tic = time.perf_counter()
    batch["ref_logp"] = multihost.to_host(score(reference))
    timings["time/reference"] = time.perf_counter() - tic
  return batch, old_logp


class GRPO:
  """GRPO-family RL on `config.task` (configs/grpo_*.py); a `training.loop.Method`."""

  name = "grpo"
  # `config.lora.rank` > 0 trains adapters on a frozen base (`training.loop`).
  supports_lora = True

  def __init__(self, config):
    self.config = config
    self.updates_per_step = config.ppo_epochs * config.ppo_mini_batches
    self.data_iter = None
    self.source = None
    # Checked before anything is built: a bad `config.rollout` fails in seconds.
    self.rollout_options = async_rollouts.rollout_options(config)
    self.sampler_correction = uses_sampler_correction(config)

  def build_model(self, run: loop.Run):
    task, tokenizer, _, model = run_setup.build_run(
      self.config, str(run.workdir), run.train_mesh, run.train_rules)
    self.build_parts(task, tokenizer)
    self.model = model
    return model

  def build_parts(self, task, tokenizer) -> None:
    """Everything `build_model` sets up besides the model: the task, the tokenizer, the
    grammar, the objective and the step's parts (a policy built elsewhere, e.g. one base
    shared by several adapters' runs in `methods.multi_lora`, then goes into `self.model`)."""
    config = self.config
    self.task, self.tokenizer = task, tokenizer
    self.grammar = task_grammar(config, self.task, self.tokenizer)
    self.objective = policy_objective(config, **grammar_loss_extra(self.grammar))
    # The optional parts of the step (`methods.step_parts`): priors, scales, replay, terms.
    self.parts = step_parts.build_step_parts(config, self.task)
    pertmind = build_pertmind(config)  # PertMind's reward; first, as it sets the advantages
    if pertmind is not None:
      self.parts = {"pertmind": pertmind, **self.parts}
    if self.rollout_options.old_logp == "detached":
      # Parts that rewrite the batch or wrap the loss may read `old_logp` (on the host or in
      # the loss); with "detached" the batch has none, so they need the scoring pass.
      readers = [k for k, part in self.parts.items()
                 if hasattr(part, "transform") or hasattr(part, "wrap_loss")]
      if readers:
        raise ValueError(f"config.rollout.old_logp='detached' leaves old_logp out of the batch, "
                         f"and config.{readers[0]} reads or rewrites the batch: use "
                         "old_logp='trainer'")
    self.loss_fn, self.shared_keys = self.objective.loss_fn, ()
    for part in self.parts.values():
      if hasattr(part, "wrap_loss"):
        self.loss_fn = part.wrap_loss(self.loss_fn)
        self.shared_keys += tuple(part.shared_keys)

  def hooks(self, name: str):
    """The parts that implement hook `name`, in run order."""
    return [getattr(part, name) for part in self.parts.values() if hasattr(part, name)]

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    self.runtime = policy_runtime(run, config, self.model, self.tokenizer, self.task,
                                  self.loss_fn, shared=self.shared_keys,
                                  grammar=getattr(self, "grammar", None))
    self.step_fn, self.sampler, self.scorer, self.evaluator = self.runtime
    # Without a KL term (β = 0, the default) no reference is kept: a frozen copy would cost a
    # whole model of device memory for nothing. It is the starting policy, in the trainer's
    # layout, also after a restart. In a LoRA run that copies the starting adapters only
    # (b = 0): scored with the frozen base, the reference is the base model itself.
    self.reference = (jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None)
    # Which pool tasks each step draws: a shuffled pass, or a part's loader (a task prior).
    loaders = [part.loader for part in self.parts.values() if hasattr(part, "loader")]
    self.data_iter = (loaders[0] if loaders
                      else iter(task_loader(config, self.task, config.prompts_per_step,
                                            self.tokenizer)))
    self.rng = jax.random.key(config.seed + 1)
    self.source = group_source.build_group_source(
      self, self.rollout_options, draw=lambda: global_records(self.data_iter),
      verify=lambda records, texts, group_ids, lengths: verify_groups(
        self.objective, self.task, records, texts, group_ids, config, lengths=lengths),
      advantages=lambda rewards, group_ids, num_groups, lengths: advantages_of(
        self.objective, rewards, group_ids, num_groups, config, lengths=lengths))
    for start in self.hooks("start"):
      start(self, state)

  def policy_params(self, params):
    """The policy's parameters in the base graph (what a weight sync publishes): a LoRA run's
    adapters merged into the frozen base (`models.lora.merge_adapters`), else `params`."""
    frozen = getattr(self.run, "frozen", None)
    return params if frozen is None else merge_adapters(params, frozen)

  def state_dict(self) -> dict[str, Any]:
    if self.source is None:
      return {"data": self.data_iter.get_state()}
    return {"data": self.source.data_state(), "source": self.source.state_dict()}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "data" in state:
      self.data_iter.set_state(state["data"])
    if self.source is not None and "source" in state:
      self.source.load_state_dict(state["source"])

  def close(self) -> None:
    """Stops the rollout producer, if any (the loop calls this when the run ends)."""
    if self.source is not None:
      self.source.close()

  def array_state(self) -> dict[str, Any]:
    return {k: part.array_state() for k, part in self.parts.items()
            if hasattr(part, "array_state")}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    for key, part in self.parts.items():
      if hasattr(part, "load_array_state"):
        part.load_array_state(arrays[key])

  def sharded_state(self) -> dict[str, Any]:
    return {k: part.sharded_state() for k, part in self.parts.items()
            if hasattr(part, "sharded_state")}

  def load_sharded_state(self, tree: Mapping[str, Any]) -> None:
    for key, part in self.parts.items():
      if hasattr(part, "load_sharded_state"):
        part.load_sharded_state(tree[key])

  def rollout(self, state, records, step: int, timings: dict[str, float]):
    """`group_size` completions per record, sampled with the sampler's copy of the policy."""
    return sample_groups(self.runtime, state.params, [r["prompt"] for r in records],
                         self.config, jax.random.fold_in(self.rng, step), timings)

  def step(self, state, step: int):
    config, run = self.config, self.run
    timings: dict[str, float] = {}
    extra: dict[str, float] = {}
    for begin_step in self.hooks("begin_step"):
      extra |= begin_step(self, state, step)
    if self.source is None:
      records = global_records(self.data_iter)
      rollout = self.rollout(state, records, step, timings)
      texts = self.sampler.decode_text(rollout)
      verified = verify_groups(self.objective, self.task, records, texts, rollout.group_ids,
                               config, lengths=multihost.to_host(rollout.lengths))
    else:  # Asynchronous rollouts or dynamic sampling (`methods.group_source`).
      records, rollout, texts, verified, metrics = self.source.take(state, step, timings)
      extra |= metrics
    put = functools.partial(put_batch, mesh=run.train_mesh, rules=run.train_rules)
    ctx = step_parts.StepContext(step, records, rollout, verified, {}, put)
    for rewards in self.hooks("rewards"):
      verified, metrics = rewards(self, ctx)
      ctx, extra = ctx._replace(verified=verified), extra | metrics
    batch, old_logp = score_rollout(
      self.runtime, config, put, state.params, rollout, verified.adv, timings,
      reference=self.reference, old_logp_source=self.rollout_options.old_logp)
    if self.sampler_correction:
      # The sampler's own log-probs, for the TIS / IcePop weights exp(old_logp − sampler_logp)
      # (`losses.sampler_importance_weights`): off-policy batches and engine mismatch.
      width = batch["completion_mask"].shape[1]
      batch["sampler_logp"] = np.asarray(multihost.to_host(rollout.logp))[:, :width]
    if self.rollout_options.true_on_policy:
      extra |= group_source.true_on_policy_metrics(
        rollout, old_logp, batch["completion_mask"], self.rollout_options.true_on_policy_tol)
    ctx = ctx._replace(fresh=batch)
    for transform in self.hooks("transform"):
      batch, metrics = transform(self, state, batch, ctx)
      extra |= metrics
    tic = time.perf_counter()
    state, updates = ppo.ppo_phase(
      self.step_fn, state, batch, epochs=config.ppo_epochs, mini_batches=config.ppo_mini_batches,
      rng=np.random.default_rng([config.seed, step]), put=put)
    timings["time/update"] = time.perf_counter() - tic
    if self.source is not None:
      extra |= self.source.after_update(state, step)
    for after_update in self.hooks("after_update"):
      extra |= after_update(self, ctx)
    record = step_record(updates, rollout, old_logp, verified, ctx.fresh["completion_mask"],
                         timings)
    return state, record | extra

  def evaluate(self, state, step: int) -> dict[str, float]:
    return self.evaluator(state.params, step)

  def progress(self, record):
    return {"reward": record["train/reward_correct"], "tok_s": record["train/tokens_per_s"]}

  def summary(self, records) -> str:
    return loop.eval_summary(records, "eval/accuracy", "held-out accuracy")
