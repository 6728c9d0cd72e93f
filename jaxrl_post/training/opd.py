"""Multi-teacher on-policy distillation (Open-MOPD) glue: routing, teacher scores, inner updates.

One rollout step of experiments/opd.py, in the order these helpers are called:

  routing = teacher_routing(config.teachers, task.domains)    # ValueError before compiling
  teachers = load_teachers(find_teacher_checkpoints(routing), state)   # frozen params
  V, s    = student top-K ids and log-probs on its own rollout        [B, T, K]
  q       = score_routed(score_fn, teachers, routing.teacher_of_domain, rollout, domain_ids,
                         V, rows_per_call=max quota)                   [B, T, K]
  r       = topk_opd_reward(s, q, mask)                                (rollout-time reward)
  w, tab  = rollout_domain_weights(mask, domain_ids, r, ...)           [B], per-domain table
  state, updates = inner_updates(step_fn, state, batch, method.inner_updates, rng)
            # step_fn = make_train_step(graphdef, make_opd_loss(...), ...)

Teacher scoring shapes. Every row is scored by the teacher its domain label routes to (hard
routing, no averaging). Scoring the whole batch with every teacher and selecting rows would cost
D× the teacher work; gathering each domain's rows gives shapes that change with the domain mix.
`score_routed` gathers each domain's rows and pads them (by repeating one of them) to a fixed
`rows_per_call`, so all teachers share one compiled scorer (same graph, same shapes, the params
are an argument) and the work is D·rows_per_call rows. With `DomainQuotaSampler` batches the
per-domain counts are fixed, and rows_per_call = the largest quota wastes only the gap to it
(2 : 2 : 1 of 1024 prompts: 3·410 = 1230 rows scored for 1024). Domains with more rows than
`rows_per_call` are scored in several calls of the same shape.

Inner updates and refresh (spec §1.4 (f), §1.5). The rollout batch is split into K shuffled
mini-batches (`ppo.ppo_mini_batches`), one optimizer step each. Before the split, the domain
weights are computed once from statistics of the *whole* batch (`rollout_domain_weights`) and
stored per row, so any split (mini-batches, micro-batches, devices) sees the full-batch weights.
Inside the loss (`make_opd_loss`), the forward pass that the gradient needs gives the current
student's log-probs on the cached ids V; with `refresh=True` `opd_topk_ppo_loss` recomputes the
student-dependent part of the reward from them (stop-gradient), keeps the cached teacher part q,
and applies the row's domain weight after the refresh. Update j therefore uses θ_j's reward,
while the PPO ratio is still taken against the rollout-time s.

Method switches (`METHODS`, the rows of the paper's ablation): naive M-OPD (uniform weights, one
update), + token-share (M1), + gap-following (M2), full Open-MOPD (M1 + M2 + refresh, K = 4).

Reference: Gao et al., Open-MOPD, arXiv 2608.19098 (seed000_five_papers.md §1).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import losses
from jaxrl_post.losses import distillation
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
from jaxrl_post.registry import Registry
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import Sampler, score_model
from jaxrl_post.tasks.base import Task
from jaxrl_post.training import ppo
from jaxrl_post.training.checkpoint import Checkpointer, StartPoint, resolve_start

# ---------------------------------------------------------------------------------------------
# Methods.
# ---------------------------------------------------------------------------------------------


class Method(NamedTuple):
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


METHODS: Registry[Method] = Registry("opd method")
METHODS.add("naive", Method(balance_shares=False, gap_alpha=0.0, refresh=False, inner_updates=1))
METHODS.add("token_share", Method(balance_shares=True, gap_alpha=0.0, refresh=False,
                                  inner_updates=1))
METHODS.add("gap", Method(balance_shares=True, gap_alpha=1.0, refresh=False, inner_updates=1))
METHODS.add("open_mopd", Method(balance_shares=True, gap_alpha=1.0, refresh=True, inner_updates=4))


def resolve_method(name: str, **overrides: Any) -> Method:
  """The registered method `name`, with any non-None `overrides` of its fields.

  Examples:
    >>> resolve_method("naive", inner_updates=4)  # the paper's "naive matched control"
    Method(balance_shares=False, gap_alpha=0.0, refresh=False, inner_updates=4)

  Raises:
    ValueError: for an unknown method (listing the valid ones) or field, or K < 1.
  """
  try:
    method = METHODS.get(name)
  except KeyError as e:
    raise ValueError(f"config.method: {e.args[0]}") from None
  unknown = sorted(set(overrides) - set(Method._fields))
  if unknown:
    raise ValueError(f"unknown method field(s) {unknown}; valid: {', '.join(Method._fields)}")
  method = method._replace(**{k: v for k, v in overrides.items() if v is not None})
  method = Method(bool(method.balance_shares), float(method.gap_alpha), bool(method.refresh),
                  int(method.inner_updates))
  if method.inner_updates < 1:
    raise ValueError(f"inner_updates must be >= 1, got {method.inner_updates}")
  if method.gap_alpha < 0:
    raise ValueError(f"gap_alpha must be >= 0, got {method.gap_alpha}")
  return method


# ---------------------------------------------------------------------------------------------
# Teacher routing and loading.
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


# ---------------------------------------------------------------------------------------------
# Routed teacher scoring.
# ---------------------------------------------------------------------------------------------

_ROLLOUT_KEYS = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask")

ScoreFn = Callable[..., jax.Array]


def score_routed(score_fn: ScoreFn, teacher_params: Sequence[Any],
                 teacher_of_domain: Sequence[int], batch: Mapping[str, jax.Array],
                 domain_ids, candidate_ids: jax.Array, *, rows_per_call: int) -> jax.Array:
  """Each row's candidate log-probs under the teacher its domain routes to.

  q[i,t,k] = log π_{T(d(i))}(V[i,t,k] | prompt_i, y_i,<t)

  Rows of domain d are gathered, padded to `rows_per_call` by repeating one of them, scored in
  one call (or several, if there are more rows than `rows_per_call`), and written back: the
  scorer always sees `rows_per_call` rows, so all teachers share one compilation.

  Args:
    score_fn: `(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
      candidate_ids) -> [rows, T, K]` log-probs, e.g. `Sampler.score(...).candidate_logp`.
    teacher_params: one parameter pytree per distinct teacher.
    teacher_of_domain: `[D]` teacher index per domain id (`TeacherRouting.teacher_of_domain`).
    batch: the rollout arrays `prompt_tokens`, `prompt_mask` `[B, P]`, `completion_tokens`,
      `completion_mask` `[B, T]`.
    domain_ids: `[B]` int domain ids (host values).
    candidate_ids: `[B, T, K]` int32 ids to score (the student's top-K).
    rows_per_call: static number of rows per scorer call.

  Returns:
    `[B, T, K]` float32 teacher log-probs (0 where the completion mask is False).

  Raises:
    ValueError: for a domain id without a teacher.
  """
  ids = np.asarray(domain_ids)
  num_domains = len(teacher_of_domain)
  distillation.check_domain_ids(ids, num_domains)
  if rows_per_call < 1:
    raise ValueError(f"rows_per_call must be >= 1, got {rows_per_call}")
  arrays = [jnp.asarray(batch[k]) for k in _ROLLOUT_KEYS]
  candidate_ids = jnp.asarray(candidate_ids)
  out = jnp.zeros(candidate_ids.shape, jnp.float32)
  for d in range(num_domains):
    rows = np.flatnonzero(ids == d)
    params = teacher_params[teacher_of_domain[d]]
    for begin in range(0, len(rows), rows_per_call):
      chunk = rows[begin:begin + rows_per_call]
      # Repeating a real row (not zeros) keeps the padding well defined: no empty prompt.
      take = np.concatenate([chunk, np.full(rows_per_call - len(chunk), chunk[0])])
      take = jnp.asarray(take, jnp.int32)
      scored = score_fn(params, *(x[take] for x in arrays), candidate_ids[take])
      out = out.at[jnp.asarray(chunk, jnp.int32)].set(
        jnp.asarray(scored, jnp.float32)[:len(chunk)])
  return out


def sampler_score_fn(sampler: Sampler, *, temperature: float = 1.0) -> ScoreFn:
  """A `score_routed` scorer from a `Sampler` (the teachers share the student's graph)."""

  def score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
            candidate_ids):
    return sampler.score(params, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                         temperature=temperature, candidate_ids=candidate_ids).candidate_logp

  return score


# ---------------------------------------------------------------------------------------------
# Domain weights from global statistics.
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


def rollout_domain_weights(mask, domain_ids, rewards, *, num_domains: int, method: Method,
                           target_shares, clip_min: float = distillation.GAP_CLIP_MIN,
                           clip_max: float = distillation.GAP_CLIP_MAX,
                           reference: str = "share_weighted", num_chunks: int = 1,
                           ) -> tuple[jax.Array, losses.DomainWeighting]:
  """Per-row Open-MOPD weights from the statistics of the *whole* rollout batch.

  tokens_d, abs_d = Σ over chunks of `domain_token_stats(chunk)`    (additive sums)
  w_d             = `domain_weighting(tokens, abs; M1 if balance_shares, α = gap_alpha)`
  w_i             = w_{d(i)},   Σ_i w_i L_i / Σ_i L_i = 1

  Computed once per rollout batch from the rollout-time rewards, before the split into inner
  updates, and held fixed over them (spec §1.4 (e)). `num_chunks` > 1 sums the statistics chunk
  by chunk, as a batch too large for one call (or sharded) would: the weights are the same.

  Args:
    mask: `[B, T]` response mask.
    domain_ids: `[B]` int domain ids.
    rewards: `[B, T, K]` (or `[B, T]`) rollout-time rewards r.
    num_domains: D.
    method: the switches (`balance_shares`, `gap_alpha`).
    target_shares: `[D]` target token shares.
    clip_min, clip_max: clip of the gap factor (0.05, 20).
    reference: "share_weighted" (official code) or "mean" (project page).
    num_chunks: rows are summed in this many consecutive chunks (must divide B).

  Returns:
    `(weights [B] float32, DomainWeighting of [D] arrays)`.
  """
  mask = jnp.asarray(mask, jnp.float32)
  domain_ids = jnp.asarray(domain_ids, jnp.int32)
  rows = mask.shape[0]
  if num_chunks < 1 or rows % num_chunks:
    raise ValueError(f"num_chunks={num_chunks} must divide the {rows} rows")
  size = rows // num_chunks
  stats = None
  for c in range(num_chunks):
    part = slice(c * size, (c + 1) * size)
    chunk = losses.domain_token_stats(mask[part], domain_ids[part], rewards[part], num_domains)
    stats = chunk if stats is None else jax.tree.map(jnp.add, stats, chunk)
  table = losses.domain_weighting(
    stats, target_shares=jnp.asarray(target_shares, jnp.float32), alpha=method.gap_alpha,
    clip_min=clip_min, clip_max=clip_max, balance_shares=method.balance_shares,
    reference=reference)
  return jax.lax.stop_gradient(table.weight[domain_ids]), table


# ---------------------------------------------------------------------------------------------
# The loss and the inner updates.
# ---------------------------------------------------------------------------------------------

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


def inner_updates(step_fn, state, batch: Mapping[str, Any], num_updates: int,
                  rng: np.random.Generator) -> tuple[Any, list[dict[str, np.ndarray]]]:
  """K optimizer updates on one rollout batch: shuffled mini-batches, one step each.

  Each mini-batch carries its own `num_tokens` (token-mean per update, as PPO) and the rows'
  precomputed domain weights; the loss refreshes the reward with the student of that update.

  Returns:
    The new state and one host-side metrics dict per update.
  """
  updates = []
  for mini_batch in ppo.ppo_mini_batches(batch, num_updates, rng):
    state, metrics = step_fn(state, mini_batch)
    updates.append(jax.device_get(metrics))
  return state, updates


def update_metrics(updates: Sequence[Mapping[str, Any]], domains: Sequence[str]
                   ) -> dict[str, float]:
  """One step's metrics from its K updates.

  Scalars: the mean over updates (counters as in `ppo.merge_update_metrics`), plus
  `staleness_kl_last` (the last update's, the stalest). Per-domain sums become
  `<domain>/staleness_kl`, `<domain>/clip_frac` and `<domain>/update_mean_abs_reward`,
  token-weighted over all updates.
  """
  scalars = [{k: float(v) for k, v in u.items() if np.ndim(v) == 0} for u in updates]
  merged = ppo.merge_update_metrics(scalars)
  merged["staleness_kl_last"] = scalars[-1]["staleness_kl"]
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
