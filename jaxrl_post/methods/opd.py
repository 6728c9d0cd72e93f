"""Multi-teacher on-policy distillation (Open-MOPD, arXiv 2608.19098) on a task mixture.

One step, in order (`OpenMOPD.step`):

  1. prompts: `prompts_per_step` records with exact per-domain quotas (`DomainQuotaSampler`);
  2. rollout: the student samples `samples_per_prompt` responses each, keeping its top-K ids
     V and log-probs per position (`num_logprobs=config.topk`);
  3. score: the trainer scores the old student on V (s `[B, T, K]`, on its own mesh, so the
     first update's ratio is 1) and each row's routed teacher on the same ids
     (q = `score_routed(...)` `[B, T, K]`);
  4. reward: r = (q − s)·softmax_K(s) (`losses.topk_opd_reward`);
  5. advantages: per-domain weights w `[B]` from the *whole* batch's statistics
     (`losses.rollout_domain_weights`: M1 token-share balancing × M2 gap-following);
  6. update: K mini-batch updates of dual-clip PPO on V (`training.ppo.ppo_phase`, one epoch,
     K = `inner_updates` mini-batches); with `refresh` (M4) the loss recomputes the
     student part of r from each update's own student, keeps q and applies w after.

The rows of the paper's ablation are `METHODS` (`config.method`): naive M-OPD (uniform weights,
one update), + token-share (M1), + gap-following (M2), full Open-MOPD (M1 + M2 + refresh,
K = 4), and the paper's two matched controls with the same K = 4 inner updates but no refresh:
`naive_k4` (uniform weights) and `share_gap_k4` (M1 + M2). Without refresh the K updates reuse
the rollout-time reward r = (q − s_old)·softmax_K(s_old), computed once per step; only the PPO
ratio moves. So open_mopd − share_gap_k4 isolates refresh, share_gap_k4 − naive_k4 the
weighting at K = 4, and naive_k4 − naive the extra updates. `config.opd.<switch>` overrides
one switch of any of them.

Teacher scoring shapes. Every row is scored by the teacher its domain label routes to (hard
routing, no averaging). Scoring the whole batch with every teacher and selecting rows would cost
D× the teacher work; gathering each domain's rows gives shapes that change with the domain mix.
`score_routed` gathers each domain's rows and pads them (by repeating one of them) to a fixed
`rows_per_call`, so all teachers share one compiled scorer (same graph, same shapes, the params
are an argument) and the work is D·rows_per_call rows. With `DomainQuotaSampler` batches the
per-domain counts are fixed, and rows_per_call = the largest quota wastes only the gap to it
(2 : 2 : 1 of 1024 prompts: 3·410 = 1230 rows scored for 1024).

Evaluation: held-out greedy accuracy per domain and their mean, the paper's Total
(`evaluate_domains`); at step 0 also RouteRL (each domain answered by its own teacher), so
`eval/headroom_recovery` = (Total − Total(MixSFT)) / (Total(RouteRL) − Total(MixSFT)) can be
logged at every evaluation.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import losses
from jaxrl_post.methods.grpo import ROLLOUT_KEYS
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.registry import Registry
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import Sampler, rollout_metrics, score_model
from jaxrl_post.tasks.base import Task
from jaxrl_post.tasks.domain_quota import DomainQuotaSampler
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer, StartPoint, resolve_start
from jaxrl_post.training.train_state import make_train_step

# ---------------------------------------------------------------------------------------------
# Method switches: the rows of the paper's ablation.
# ---------------------------------------------------------------------------------------------


class Switches(NamedTuple):
  """The switches that make one row of Open-MOPD's ablation.

  Attributes:
    balance_shares: M1 token-share balancing (base_d = g*_d / o_d).
    gap_alpha: M2 gap-following exponent α (0 turns it off; the paper uses 1).
    refresh: M4 reward refresh before each inner update.
    inner_updates: K, optimizer updates (mini-batches) per rollout batch.
  """

  balance_shares: bool
  gap_alpha: float
  refresh: bool
  inner_updates: int


METHODS: Registry[Switches] = Registry("opd method")
METHODS.add("naive", Switches(balance_shares=False, gap_alpha=0.0, refresh=False,
                              inner_updates=1))
METHODS.add("token_share", Switches(balance_shares=True, gap_alpha=0.0, refresh=False,
                                    inner_updates=1))
METHODS.add("gap", Switches(balance_shares=True, gap_alpha=1.0, refresh=False, inner_updates=1))
METHODS.add("open_mopd", Switches(balance_shares=True, gap_alpha=1.0, refresh=True,
                                  inner_updates=4))
# The paper's matched controls (its ablation's K = 4 rows without refresh): the same number of
# optimizer updates per rollout batch as Open-MOPD, so that refresh is the only difference.
METHODS.add("naive_k4", Switches(balance_shares=False, gap_alpha=0.0, refresh=False,
                                 inner_updates=4))
METHODS.add("share_gap_k4", Switches(balance_shares=True, gap_alpha=1.0, refresh=False,
                                     inner_updates=4))


def resolve_switches(name: str, **overrides: Any) -> Switches:
  """The registered method `name`, with any non-None `overrides` of its fields.

  Examples:
    >>> resolve_switches("naive", inner_updates=4)  # = METHODS "naive_k4", the matched control
    Switches(balance_shares=False, gap_alpha=0.0, refresh=False, inner_updates=4)
    >>> resolve_switches("share_gap_k4")
    Switches(balance_shares=True, gap_alpha=1.0, refresh=False, inner_updates=4)

  Raises:
    ValueError: for an unknown method (listing the valid ones) or field, or K < 1.
  """
  try:
    switches = METHODS.get(name)
  except KeyError as e:
    raise ValueError(f"config.method: {e.args[0]}") from None
  unknown = sorted(set(overrides) - set(Switches._fields))
  if unknown:
    raise ValueError(f"unknown method field(s) {unknown}; valid: {', '.join(Switches._fields)}")
  switches = switches._replace(**{k: v for k, v in overrides.items() if v is not None})
  switches = Switches(bool(switches.balance_shares), float(switches.gap_alpha),
                      bool(switches.refresh), int(switches.inner_updates))
  if switches.inner_updates < 1:
    raise ValueError(f"inner_updates must be >= 1, got {switches.inner_updates}")
  if switches.gap_alpha < 0:
    raise ValueError(f"gap_alpha must be >= 0, got {switches.gap_alpha}")
  return switches


# ---------------------------------------------------------------------------------------------
# Teacher routing, loading and scoring.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TeacherRouting:
  """Which frozen teacher scores which domain.

  Attributes:
    domains: the domains in id order.
    paths: the distinct teacher checkpoint directories (domains sharing one share its params).
    teacher_of_domain: per domain id, the index of its teacher in `paths`.
  """

  domains: tuple[str, ...]
  paths: tuple[str, ...]
  teacher_of_domain: tuple[int, ...]

  def domains_of(self, teacher: int) -> list[str]:
    return [d for d, t in zip(self.domains, self.teacher_of_domain) if t == teacher]


def teacher_routing(teachers: Mapping[str, str], domains: Sequence[str]) -> TeacherRouting:
  """Validates a domain → teacher-checkpoint mapping against the task's domains (host-side).

  Args:
    teachers: domain label → checkpoint directory (an orbax run workdir, its `checkpoints/`
      directory, or a Hugging Face directory). A ConfigDict works.
    domains: the task's domains, in id order.

  Returns:
    A `TeacherRouting`; paths are de-duplicated (after resolving), so one checkpoint routed to
    several domains is loaded and kept once.

  Raises:
    ValueError: naming every label that is not a domain, every domain without a teacher (or
      with an empty path), and listing the known domains.
  """
  teachers = {str(k): str(v or "") for k, v in teachers.items()}
  domains = tuple(domains)
  unknown = sorted(set(teachers) - set(domains))
  if unknown:
    raise ValueError(f"teachers given for unknown domain label(s) {', '.join(map(repr, unknown))};"
                     f" known domains: {', '.join(map(repr, domains))}")
  missing = [d for d in domains if not teachers.get(d)]
  if missing:
    raise ValueError(f"no teacher checkpoint for domain(s) {', '.join(map(repr, missing))}: every "
                     f"domain needs one (config.teachers.<domain>=<checkpoint dir>)")
  paths: list[str] = []
  index: list[int] = []
  for d in domains:
    path = os.path.realpath(teachers[d])
    if path not in paths:
      paths.append(path)
    index.append(paths.index(path))
  return TeacherRouting(domains, tuple(paths), tuple(index))


def find_teacher_checkpoints(routing: TeacherRouting) -> list[StartPoint]:
  """Locates each teacher's checkpoint (no loading), so a wrong path fails before compiling.

  Raises:
    FileNotFoundError: naming the domain(s) of a path that holds no loadable checkpoint.
  """
  starts = []
  for t, path in enumerate(routing.paths):
    try:
      starts.append(resolve_start(Path("/nonexistent"), init_from=path))
    except FileNotFoundError as e:
      raise FileNotFoundError(
        f"teacher of domain(s) {', '.join(map(repr, routing.domains_of(t)))}: {e}") from None
  return starts


def load_teachers(starts: Sequence[StartPoint], state: Any, *, mesh: Mesh | None = None,
                  rules: Rules = DEFAULT_RULES) -> list[Any]:
  """Loads frozen teacher parameters shaped like the student's `state.params`.

  A teacher is an orbax checkpoint of the same architecture (an SFT or GRPO run of this
  codebase, restored like `init_from`: parameters only) or a Hugging Face directory, read
  in the student's parameter dtype (the run's `config.param_dtype`) and, with a `mesh`,
  sharded as it is read (`load_hf(mesh=...)`: each device reads only its shard).

  Args:
    starts: from `find_teacher_checkpoints`.
    state: the student's `TrainState` (or its abstract shape): the restore target.
    mesh, rules: where Hugging Face teachers are placed (default: one device).

  Returns:
    One parameter pytree per distinct teacher.

  Raises:
    ValueError: when a teacher's parameter shapes differ from the student's (OPD gathers
      the student's top-K ids in the teacher's vocabulary, so both must share it).
  """
  loaded = []
  for start in starts:
    if start.kind == "init_from_hf":
      from jaxrl_post.models.hf import load_hf  # Deferred: only HF teachers need it.

      # The student's dtype: teachers must match its parameters leaf for leaf.
      dtype = jax.tree.leaves(state.params)[0].dtype
      params = nnx.state(load_hf(start.path, dtype=dtype, mesh=mesh, rules=rules), nnx.Param)
    else:
      checkpointer = Checkpointer(start.path)
      try:
        restored, _ = checkpointer.restore(start.step, state)
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"teacher {start.path}: cannot restore into the student's "
                         f"architecture: {e}") from None
      finally:
        checkpointer.close()
      params = restored.params
    if _signature(params) != _signature(state.params):
      raise ValueError(f"teacher {start.path}: parameters differ from the student's; teachers "
                       "and student must share the architecture and vocabulary")
    loaded.append(params)
  return loaded


def _signature(tree) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
  return jax.tree.structure(tree), [(x.shape, jnp.dtype(x.dtype)) for x in jax.tree.leaves(tree)]


ScoreFn = Callable[..., jax.Array]


def score_routed(score_fn: ScoreFn, teacher_params: Sequence[Any],
                 teacher_of_domain: Sequence[int], batch: Mapping[str, Any], domain_ids,
                 candidate_ids, *, rows_per_call: int,
                 put: Callable[[Any], Any] | None = None) -> np.ndarray:
  """Each row's candidate log-probs under the teacher its domain routes to.

  q[i,t,k] = log π_{T(d(i))}(V[i,t,k] | prompt_i, y_i,<t)

  Rows of domain d are gathered (on the host), padded to `rows_per_call` by repeating one of
  them, placed (`put`), scored in one call (or several, if there are more rows than
  `rows_per_call`), and written back: the scorer always sees `rows_per_call` rows, so all
  teachers share one compilation.

  Args:
    score_fn: `(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
      candidate_ids) -> [rows, T, K]` log-probs, e.g. `Sampler.score(...).candidate_logp`.
    teacher_params: one parameter pytree per distinct teacher.
    teacher_of_domain: `[D]` teacher index per domain id (`TeacherRouting.teacher_of_domain`).
    batch: the rollout arrays `prompt_tokens`, `prompt_mask` `[B, P]`, `completion_tokens`,
      `completion_mask` `[B, T]` (host or device values; gathered on the host).
    domain_ids: `[B]` int domain ids (host values).
    candidate_ids: `[B, T, K]` int ids to score (the student's top-K).
    rows_per_call: static number of rows per scorer call.
    put: places one call's arrays (`parallel.mesh.put_batch` on the trainer's mesh); None
      leaves them to `jit`.

  Returns:
    `[B, T, K]` float32 teacher log-probs, on the host (0 where the completion mask is False).

  Raises:
    ValueError: for a domain id without a teacher.
  """
  ids = np.asarray(domain_ids)
  num_domains = len(teacher_of_domain)
  losses.check_domain_ids(ids, num_domains)
  if rows_per_call < 1:
    raise ValueError(f"rows_per_call must be >= 1, got {rows_per_call}")
  arrays = multihost.to_host([batch[k] for k in ROLLOUT_KEYS] + [candidate_ids])
  out = np.zeros(np.shape(candidate_ids), np.float32)
  for d in range(num_domains):
    rows = np.flatnonzero(ids == d)
    params = teacher_params[teacher_of_domain[d]]
    for begin in range(0, len(rows), rows_per_call):
      chunk = rows[begin:begin + rows_per_call]
      # Repeating a real row (not zeros) keeps the padding well defined: no empty prompt.
      take = np.concatenate([chunk, np.full(rows_per_call - len(chunk), chunk[0])])
      inputs = [np.asarray(x)[take] for x in arrays]
      scored = score_fn(params, *(inputs if put is None else put(inputs)))
      out[chunk] = np.asarray(multihost.to_host(scored), np.float32)[:len(chunk)]
  return out


def sampler_score_fn(sampler: Sampler, *, temperature: float = 1.0) -> ScoreFn:
  """A `score_routed` scorer from a `Sampler` (the teachers share the student's graph)."""

  def score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
            candidate_ids):
    return sampler.score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                         temperature=temperature, candidate_ids=candidate_ids).candidate_logp

  return score


# ---------------------------------------------------------------------------------------------
# Domain weights, the loss, the step's metrics.
# ---------------------------------------------------------------------------------------------


def target_share_vector(target_shares: Mapping[str, float], domains: Sequence[str]) -> np.ndarray:
  """Target token shares per domain id from a domain → share mapping.

  An empty mapping means uniform. A domain left out gets target 0, as in the official code
  (`domain_weighting` renormalises over the domains present in a batch).

  Raises:
    ValueError: for a label that is not a domain, or a negative share.

  Examples:
    >>> target_share_vector({"a": 1.0, "c": 2.0}, ("a", "b", "c")).tolist()
    [1.0, 0.0, 2.0]
  """
  shares = {str(k): float(v) for k, v in dict(target_shares).items()}
  unknown = sorted(set(shares) - set(domains))
  if unknown:
    raise ValueError(f"target shares for unknown domain(s) {unknown}; known: {list(domains)}")
  if any(v < 0 for v in shares.values()):
    raise ValueError(f"target shares must be >= 0, got {shares}")
  if not shares:
    return np.full(len(domains), 1.0 / len(domains), np.float32)
  return np.asarray([shares.get(d, 0.0) for d in domains], np.float32)


def make_opd_loss(*, num_domains: int, temperature: float = 1.0, refresh: bool = True,
                  epsilon_low: float = 0.2, epsilon_high: float = 0.28,
                  dual_clip_c: float | None = 3.0, max_log_ratio: float | None = 20.0):
  """`(model, batch) -> (loss, aux)` of Open-MOPD for `make_train_step`.

  The batch holds the rollout (`prompt_*`, `completion_*`), `topk_ids` V `[b, T, K]`,
  `old_topk_logp` s and `teacher_topk_logp` q `[b, T, K]`, `seq_weights` w `[b]`,
  `domain_ids` `[b]`, and the (mini-)batch's `num_tokens`. One forward pass gives the
  current log-probs s_cur on V; `opd_topk_ppo_loss` then refreshes the reward from sg(s_cur)
  (when `refresh`), multiplies by w after the refresh, and takes the dual-clip PPO loss against
  s, summed over K, token-mean.

  Aux: the additive `OPDTopKAux` fields, plus per-domain *sums* (`[D]` arrays, so they add up
  over micro-batches like the rest): `domain_tokens`, `domain_abs_reward` (Σ m|Σ_k r| of the
  reward used), `domain_staleness` (Σ m·KL(p̃_old ‖ p̃_cur)) and `domain_clipped`
  (clipped (token, candidate) pairs / K). `update_metrics` turns them into ratios.
  """

  def loss(model, batch):
    mask = batch["completion_mask"]
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], mask, temperature=temperature,
                         candidate_ids=batch["topk_ids"])
    current = scored.candidate_logp
    old, teacher = batch["old_topk_logp"], batch["teacher_topk_logp"]
    value, aux = losses.opd_topk_ppo_loss(
      current, old, teacher, mask, seq_weights=batch["seq_weights"], refresh=refresh,
      epsilon_low=epsilon_low, epsilon_high=epsilon_high, dual_clip_c=dual_clip_c,
      max_log_ratio=max_log_ratio, num_tokens=batch["num_tokens"])
    metrics = aux.additive()

    # Per-domain diagnostics of this update (no gradient): the reward the loss used, its
    # staleness and clip fraction, as sums over the micro-batch.
    sg_current = jax.lax.stop_gradient(current)
    used = losses.topk_opd_reward(sg_current if refresh else old, teacher, mask)
    stats = losses.domain_token_stats(mask, batch["domain_ids"], used, num_domains)
    per_domain = losses.domain_metrics(
      mask, batch["domain_ids"], used, num_domains=num_domains,
      seq_weights=batch["seq_weights"], old_topk_logp=old, topk_logp=sg_current,
      epsilon_low=epsilon_low, epsilon_high=epsilon_high, max_log_ratio=max_log_ratio)
    metrics.update(domain_tokens=stats.num_tokens, domain_abs_reward=stats.abs_reward,
                   domain_staleness=per_domain.staleness_kl * stats.num_tokens,
                   domain_clipped=per_domain.clip_frac * stats.num_tokens)
    return value, metrics

  return loss


def update_metrics(updates: Sequence[Mapping[str, Any]], domains: Sequence[str]
                   ) -> dict[str, float]:
  """One step's metrics from its K updates (`ppo.ppo_phase`'s list).

  Scalars: `ppo.merge_update_metrics` (the mean over updates, counters as there), plus
  `staleness_kl_last` (the last update's, the stalest). The per-domain sums of `make_opd_loss`
  (`[D]` arrays) are summed over the updates and become `<domain>/staleness_kl`,
  `<domain>/clip_frac` and `<domain>/update_mean_abs_reward`, token-weighted over all updates
  (a domain without tokens in this step gets none).
  """
  merged = ppo.merge_update_metrics(updates)
  merged["staleness_kl_last"] = float(updates[-1]["staleness_kl"])
  total = {k: np.sum([np.asarray(u[k], np.float64) for u in updates], axis=0)
           for k in ("domain_tokens", "domain_abs_reward", "domain_staleness", "domain_clipped")}
  tokens = np.maximum(total["domain_tokens"], 1e-30)
  for i, d in enumerate(domains):
    if total["domain_tokens"][i] > 0:
      merged[f"{d}/staleness_kl"] = float(total["domain_staleness"][i] / tokens[i])
      merged[f"{d}/clip_frac"] = float(total["domain_clipped"][i] / tokens[i])
      merged[f"{d}/update_mean_abs_reward"] = float(total["domain_abs_reward"][i] / tokens[i])
  return merged


def rollout_domain_metrics(mask, domain_ids, rewards, weights, table: losses.DomainWeighting,
                           domains: Sequence[str]) -> dict[str, float]:
  """Per-domain rollout-time metrics: shares, budget, mean |reward| and the weighting pieces.

  `<d>/token_share`, `<d>/prompt_share`, `<d>/budget_share` (Σ w_i·Σ_t m|Σ_k r| over d, as a
  share), `<d>/mean_abs_reward` (rollout-time m_d), `<d>/weight` (w_d), `<d>/share_weight`
  (M1 base_d), `<d>/gap_factor` (M2 factor_d).
  """
  m = losses.domain_metrics(mask, jnp.asarray(domain_ids, jnp.int32), rewards,
                            num_domains=len(domains), seq_weights=weights)
  columns = dict(token_share=m.token_share, prompt_share=m.prompt_share,
                 budget_share=m.budget_share, mean_abs_reward=m.mean_abs_reward,
                 weight=table.weight, share_weight=table.share_weight,
                 gap_factor=table.gap_factor)
  columns = jax.device_get(columns)
  return {f"{d}/{name}": float(values[i]) for name, values in columns.items()
          for i, d in enumerate(domains)}


# ---------------------------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------------------------


def evaluate_domains(sampler: Sampler, params_of_domain: Callable[[str], Any], task: Task,
                     records: Mapping[str, Sequence[Mapping[str, Any]]], *, max_new_tokens: int,
                     timeout_s: float | None = None) -> dict[str, float]:
  """Held-out greedy accuracy per domain and their mean, `total` (the paper's Total).

  Args:
    sampler: the sampler (its graph is shared by student and teachers).
    params_of_domain: domain → the parameters that answer it: the student for every domain,
      or each domain's own teacher (RouteRL, the paper's headroom reference).
    task: a task whose `reward` scores every record (the mixture delegates by domain).
    records: domain → held-out records.
    max_new_tokens: generation budget.
    timeout_s: per-sample verifier time limit.

  Returns:
    `{"<d>/accuracy", "<d>/format" for each domain, "total"}`.
  """
  metrics = {}
  for domain, rows in records.items():
    greedy = sampler.generate(params_of_domain(domain), [r["prompt"] for r in rows],
                              max_new_tokens=max_new_tokens, greedy=True)
    correct, fmt, _ = rewards_for(task, rows, sampler.decode_text(greedy), 1,
                                     timeout_s=timeout_s)
    metrics[f"{domain}/accuracy"] = float(np.nanmean(correct))
    metrics[f"{domain}/format"] = float(np.nanmean(fmt))
  metrics["total"] = float(np.mean([metrics[f"{d}/accuracy"] for d in records]))
  return metrics


def headroom_recovery(method, mixsft, routerl):
  """Share of the MixSFT → RouteRL headroom a method recovers (Open-MOPD, arXiv 2608.19098).

  recovery = (Total(method) − Total(MixSFT)) / (Total(RouteRL) − Total(MixSFT))

  Works on Python floats and numpy / jax arrays.

  Examples:
    >>> round(headroom_recovery(31.24, 25.67, 32.35), 3)  # Open-MOPD: 5.57 / 6.68
    0.834
  """
  headroom = routerl - mixsft
  if isinstance(headroom, (int, float)) and headroom == 0:
    raise ValueError("RouteRL and MixSFT totals are equal: no headroom to recover")
  return (method - mixsft) / headroom


# ---------------------------------------------------------------------------------------------
# The method.
# ---------------------------------------------------------------------------------------------


class OpenMOPD:
  """Multi-teacher OPD on `config.task`'s domains (configs/opd_mix.py); a `training.loop.Method`.

  Its own state (checkpointed): the quota sampler's position and the step-0 reference totals
  (`student_total` = MixSFT, `route_total` = RouteRL) that `eval/headroom_recovery` needs.
  """

  def __init__(self, config):
    self.config = config
    self.switches = resolve_switches(config.method,
                                     **{k: config.opd[k] for k in Switches._fields})
    self.name = f"opd:{config.method}"
    self.updates_per_step = self.switches.inner_updates
    self.reference: dict[str, float] = {}

  def build_model(self, run: loop.Run):
    config = self.config
    self.task, self.tokenizer, _, self.model = run_setup.build_run(
      config, str(run.workdir), run.train_mesh, run.train_rules)
    task = self.task
    if not hasattr(task, "domains"):
      raise ValueError(f"config.task={config.task!r} has no domains; use task='mixture'")
    self.domains = tuple(task.domains)
    # Teachers are located (not loaded) here, so a wrong path fails before anything compiles.
    self.routing = teacher_routing(dict(config.teachers), self.domains)
    self.teacher_starts = find_teacher_checkpoints(self.routing)
    self.target_shares = target_share_vector(dict(config.opd.target_shares), self.domains)
    rows = config.prompts_per_step * config.samples_per_prompt
    if rows % (self.switches.inner_updates * config.num_micro_batches):
      raise ValueError(f"inner_updates ({self.switches.inner_updates}) × "
                       f"config.num_micro_batches ({config.num_micro_batches}) must divide the "
                       f"{rows} rollouts per step")
    if not 1 <= config.topk <= self.tokenizer.vocab_size:
      raise ValueError(f"config.topk={config.topk} must be in [1, {self.tokenizer.vocab_size}]")
    # Every process draws the same global batch (the sampler is seeded), exact quotas in each.
    self.quota = DomainQuotaSampler(
      task.weights, pool_sizes=task.pool_sizes(config.num_train_examples),
      batch_size=config.prompts_per_step, seed=config.seed)
    return self.model

  def start(self, run: loop.Run, state) -> None:
    config, placement, switches = self.config, run.placement, self.switches
    self.run = run
    # Frozen teachers in the trainer's layout: restored into the (born-sharded) student state,
    # so they score on the trainer's mesh with the student's shardings and compilations.
    self.teachers = load_teachers(self.teacher_starts, state, mesh=run.train_mesh,
                                  rules=run.train_rules)
    logging.info("%s: %s; teachers %s", self.name, switches,
                 dict(zip(self.domains, (self.routing.paths[t]
                                         for t in self.routing.teacher_of_domain))))
    logging.info("per-batch quotas %s", dict(zip(self.domains, self.quota.quotas)))
    loss_fn = make_opd_loss(
      num_domains=len(self.domains), temperature=config.temperature, refresh=switches.refresh,
      epsilon_low=config.opd.epsilon_low, epsilon_high=config.opd.epsilon_high,
      dual_clip_c=config.opd.dual_clip_c, max_log_ratio=config.opd.max_log_ratio)
    self.step_fn = make_train_step(run.graphdef, loss_fn, run.optimizer,
                                   num_micro_batches=config.num_micro_batches,
                                   mesh=run.train_mesh, rules=run.train_rules,
                                   shared=("num_tokens", "num_sequences"))
    # One prompt width for all generation: batches mixing the domains need the longest prompts
    # anyway, and evaluations of short-prompt domains then reuse the same compiled kernels.
    buckets = (config.prompt_len,)
    self.sampler = Sampler(self.model, self.tokenizer, max_prompt_len=config.prompt_len,
                           prompt_len_buckets=buckets, mesh=placement.sample_mesh,
                           rules=placement.sample_rules)
    # The old student and the teachers are scored by the trainer, on its mesh: s then comes
    # from the same parameters and sharding as the update's forward pass (the first PPO ratio
    # is 1 up to float noise).
    scorer = Sampler(self.model, self.tokenizer, max_prompt_len=config.prompt_len,
                     prompt_len_buckets=buckets, mesh=run.train_mesh, rules=run.train_rules)
    self.scorer = scorer
    self.score_fn = sampler_score_fn(scorer, temperature=config.temperature)
    # With exact quotas every domain has a fixed row count: the largest one is the teachers'
    # fixed scoring shape (one compile for all of them).
    self.rows_per_call = max(self.quota.quotas) * config.samples_per_prompt
    if config.eval_examples < 1:
      # The headroom metrics (student and RouteRL totals at step 0) come from evaluation.
      raise ValueError(f"config.eval_examples must be >= 1 for on-policy distillation (the "
                       f"headroom metrics need held-out evaluation); got {config.eval_examples}")
    self.eval_records = {d: [self.task.make_domain_example(d, "test", j)
                             for j in range(config.eval_examples)] for d in self.domains}
    self.rng = jax.random.key(config.seed + 1)

  def state_dict(self) -> dict[str, Any]:
    return {"quota_sampler": self.quota.get_state(), "reference": dict(self.reference)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "quota_sampler" in state:
      self.quota.set_state(state["quota_sampler"])
    self.reference = dict(state.get("reference", {}))

  def put(self, tree):
    return put_batch(tree, self.run.train_mesh, self.run.train_rules)

  def sampler_params(self, params):
    """`params` in the sampler's layout (in place when colocated, a copy when not)."""
    placement = self.run.placement
    return reshard_state(params, placement.sample_mesh, placement.sample_rules)[0]

  def step(self, state, step: int):
    config, switches = self.config, self.switches
    n = config.samples_per_prompt
    timings: dict[str, float] = {}
    # 1. Prompts, exact quotas.
    drawn = self.quota.next_batch()
    records = [self.task.make_domain_example(d, "train", int(j))
               for d, j in zip(drawn["domain"], drawn["index"])]
    domain_ids = np.repeat(losses.encode_domain_labels(list(drawn["domain"]), self.domains),
                           n).astype(np.int32)

    # 2. Rollout with the student's top-K ids V and log-probs. The sampler's copy of the
    # parameters may alias `state.params`, which the update donates: made afresh each step.
    tic = time.perf_counter()
    rollout = self.sampler.generate(
      self.sampler_params(state.params), [r["prompt"] for r in records],
      n_samples_per_prompt=n, max_new_tokens=config.max_new_tokens,
      temperature=config.temperature, top_p=config.top_p, num_logprobs=config.topk,
      rng=jax.random.fold_in(self.rng, step))
    rollout.completion_tokens.block_until_ready()
    timings["time/generate"] = time.perf_counter() - tic

    # 3. Scores on the trainer's mesh: the old student on V, then each row's routed teacher.
    # To the host first (the rollout may sit on the sampler's devices or other processes).
    batch = multihost.to_host(dict({k: getattr(rollout, k) for k in ROLLOUT_KEYS},
                                   topk_ids=rollout.topk_ids))
    mask = batch["completion_mask"]
    tic = time.perf_counter()
    inputs = self.put(batch)
    old = self.scorer.score(state.params, *(inputs[k] for k in ROLLOUT_KEYS),
                            temperature=config.temperature, candidate_ids=inputs["topk_ids"])
    old_topk, old_logp = multihost.to_host((old.candidate_logp, old.logp))
    timings["time/score_student"] = time.perf_counter() - tic
    tic = time.perf_counter()
    teacher_topk = score_routed(self.score_fn, self.teachers, self.routing.teacher_of_domain,
                                batch, domain_ids, batch["topk_ids"],
                                rows_per_call=self.rows_per_call, put=self.put)
    timings["time/score_teachers"] = time.perf_counter() - tic

    # 4-5. Rollout-time reward r = (q − s)·softmax_K(s) and the domain weights, from the whole
    # batch before any split: every mini-/micro-batch and device sees the full-batch weights.
    rewards = losses.topk_opd_reward(old_topk, teacher_topk, mask)
    weights, table = losses.rollout_domain_weights(
      mask, domain_ids, rewards, target_shares=self.target_shares, alpha=switches.gap_alpha,
      balance_shares=switches.balance_shares, clip_min=config.opd.gap_clip_min,
      clip_max=config.opd.gap_clip_max, reference=config.opd.gap_reference)
    batch.update(old_topk_logp=old_topk, teacher_topk_logp=teacher_topk,
                 seq_weights=np.asarray(weights, np.float32), domain_ids=domain_ids)

    # 6. K inner updates (one epoch of K mini-batches); the shuffle depends only on
    # (seed, step), so a resumed run takes the same updates.
    tic = time.perf_counter()
    state, updates = ppo.ppo_phase(self.step_fn, state, batch, epochs=1,
                                   mini_batches=switches.inner_updates,
                                   rng=np.random.default_rng([config.seed, step]), put=self.put)
    metrics = update_metrics(updates, self.domains)
    timings["time/update"] = time.perf_counter() - tic

    # Task rewards of the rollouts (not trained on: a progress signal per domain).
    correct, fmt, failures = rewards_for(self.task, records, self.sampler.decode_text(rollout),
                                         n, timeout_s=config.reward_timeout_s)
    record = {f"train/{k}": v for k, v in metrics.items() if "/" not in k}
    record.update({f"domain/{k}": v for k, v in metrics.items() if "/" in k})
    record.update({f"domain/{k}": v for k, v in rollout_domain_metrics(
      mask, domain_ids, rewards, weights, table, self.domains).items()})
    for i, d in enumerate(self.domains):
      record[f"domain/{d}/reward_correct"] = float(np.nanmean(correct[domain_ids == i]))
    stats = rollout_metrics(rollout, old_logp)
    top_diff = np.abs(multihost.to_host(rollout.topk_logp) - old_topk)[mask]
    stats["topk_logp_abs_diff_max"] = float(top_diff.max()) if top_diff.size else 0.0
    record.update({f"rollout/{k}": v for k, v in stats.items()})
    tokens = int(mask.sum())
    record.update({"train/reward_correct": float(np.nanmean(correct)),
                   "train/reward_format": float(np.nanmean(fmt)),
                   "train/reward_failures": failures.total,
                   "train/tokens_per_s": tokens / sum(timings.values()), **timings})
    return state, record

  def evaluate_params(self, params_of_domain: Callable[[str], Any]) -> dict[str, float]:
    config = self.config
    return evaluate_domains(self.sampler, params_of_domain, self.task, self.eval_records,
                            max_new_tokens=config.max_new_tokens,
                            timeout_s=config.reward_timeout_s)

  def evaluate(self, state, step: int) -> dict[str, float]:
    record = {}
    if step == 0 and self.config.eval_teachers:
      # RouteRL, the paper's headroom reference: each domain answered by its own teacher.
      teachers = [self.sampler_params(t) for t in self.teachers]
      of_domain = dict(zip(self.domains, self.routing.teacher_of_domain))
      route = self.evaluate_params(lambda d: teachers[of_domain[d]])
      self.reference["route_total"] = route["total"]
      record.update({f"route/{k}": v for k, v in route.items()})
      logging.info("RouteRL reference (each domain by its teacher): %s", route)
    params = self.sampler_params(state.params)
    metrics = self.evaluate_params(lambda d: params)
    if step == 0 and "student_total" not in self.reference:
      self.reference["student_total"] = metrics["total"]  # MixSFT: the starting student
    reference = self.reference
    if "route_total" in reference and reference["route_total"] != reference["student_total"]:
      metrics["headroom_recovery"] = float(headroom_recovery(
        metrics["total"], reference["student_total"], reference["route_total"]))
    record.update({f"eval/{k}": v for k, v in metrics.items()})
    return record

  def progress(self, record):
    return {"reward": record["train/reward_mean"], "stale": record["train/staleness_kl_last"]}

  def summary(self, records) -> str:
    lines = []
    evals = [r for r in records if "eval/total" in r]
    if evals:
      first, last = evals[0], evals[-1]
      per_domain = ", ".join(f"{d} {last[f'eval/{d}/accuracy']:.3f}" for d in self.domains)
      lines.append(f"held-out Total {first['eval/total']:.3f} at step {first['step']} → "
                   f"{last['eval/total']:.3f} at step {last['step']} ({per_domain})")
    if "route_total" in self.reference:
      lines.append(f"RouteRL reference Total {self.reference['route_total']:.3f}")
    return "\n".join(lines)
