"""Proposers of reward modules for the MLREF loop (arXiv 2608.18827, Algorithm 1).

A proposer writes the reflections, the initial pool, improvement plans and the LLM-credit
weights. Two implementations:

* `LLMProposer`: an LLM behind an OpenAI-compatible chat-completions API (`llm_client`), with
  the prompt templates of `prompts`.
* `OfflineProposer`: no network. A template library over the environment's features plus
  mutations (perturbed constants, swapped shapings, deletes of low-credit modules), seeded per
  (iteration, variant) so a resumed run proposes exactly what an uninterrupted one would.

Proposers only *propose*: every module they write is vetted (`sandbox.vet_modules`) before it can
enter a pool.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Mapping, Protocol, Sequence

import numpy as np

from jaxrl_post.rewards import module_code, prompts
from jaxrl_post.rewards.llm_client import ChatClient
from jaxrl_post.rewards.module_pool import ImprovePlan, PlanOp, Pool, PoolState


class ProposerError(RuntimeError):
  """The proposer could not produce a usable answer (bad reply, API failure, budget)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskInfo:
  """What the proposer knows about the problem.

  Attributes:
    task: the task and its success metric, in words.
    environment: the environment (dynamics, episode structure), in words.
    feature_spec: feature name → per-sample shape, the inputs of every module.
    feature_docs: feature name → meaning and units.
    feature_stats: feature name → (mean, std), the feature's typical value and spread (e.g.
      under random actions, `rl_control.adapter.feature_statistics`), what a reader of the
      docs would know about its scale. Vector features: the mean over components of the
      per-component mean / std. Optional (empty: scales unknown).
  """
  task: str
  environment: str
  feature_spec: Mapping[str, tuple[int, ...]]
  feature_docs: Mapping[str, str] = dataclasses.field(default_factory=dict)
  feature_stats: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


class Proposer(Protocol):
  """What the MLREF loop needs from a proposer. Methods may raise `ProposerError`."""

  def reflect(self, info: TaskInfo, state: PoolState, *, iteration: int) -> str:
    """Iteration 1: task + environment reflection; later: feedback reflection."""

  def init_pool(self, info: TaskInfo, reflection: str, *, iteration: int, variant: int,
                num_variants: int) -> ImprovePlan:
    """The initial pool of one variant, as a plan of ADD ops with code."""

  def improve_pool(self, info: TaskInfo, pool: Pool, reflection: str, state: PoolState, *,
                   iteration: int, variant: int, num_variants: int) -> ImprovePlan:
    """An ADD / DELETE / MODIFY / REWRITE plan (with code) for one variant of `pool`."""

  def propose_weights(self, info: TaskInfo, pool: Pool, reflection: str, *, iteration: int,
                      variant: int, k: int) -> dict[str, float]:
    """Module selection and weights (unselected modules may be left out): the LLM credit."""


def _features_text(info: TaskInfo) -> str:
  return prompts.format_features(info.feature_spec, info.feature_docs, info.feature_stats)


def _contract(info: TaskInfo) -> str:
  return prompts.contract(info.feature_spec, info.feature_docs, info.feature_stats)


def feedback_kind(state: PoolState) -> str:
  """'failed' (last round rolled back), 'new_best' (it set S_best) or 'regressed'."""
  if not state.history:
    return "failed"
  return state.history[-1].get("kind", "regressed")


def format_pool(pool: Pool, scores: Mapping[str, float] | None = None) -> str:
  """One line per module: uid, description, EMA credits, selection count."""
  if not len(pool):
    return "  (empty)"
  lines = []
  for m in pool.modules:
    st = pool.stats[m.name]
    s = f" s={scores[m.name]:.3f}" if scores and m.name in scores else ""
    lines.append(f"  - {m.uid}: {m.description} [c_llm={st.ema_llm:.3f} "
                 f"c_corr={st.ema_corr:+.3f} n={st.count}{s}]")
  return "\n".join(lines)


def format_feedback(state: PoolState) -> str:
  """The previous round as text: best so far, variant scores, selections, failures, rejects."""
  lines = []
  if state.best_reward:
    b = state.best_reward
    mods = ", ".join(f"{m['name']}@{m['version']} (w={w:.3f})"
                     for m, w in zip(b["modules"], b["weights"]))
    lines.append(f"Best so far: score {b['score']:.4g} at iteration {b['iteration']} "
                 f"with {mods}.")
  if state.history:
    last = state.history[-1]
    for v in last.get("variants", []):
      sel = ", ".join(f"{n} ({w:.3f})" for n, w in zip(v.get("selected", []),
                                                       v.get("weights", [])))
      score = v.get("score")
      score_txt = "failed" if score is None else f"{score:.4g}"
      fate = "kept" if v.get("survived") else "discarded"
      lines.append(f"Variant {v['variant']}: score {score_txt} ({fate}); reward = {sel or '-'}; "
                   f"plan: {v.get('plan_summary', '-')}")
  failures = state.failures_of(state.iteration)
  if failures:
    lines.append("Failures:")
    lines += [f"  - variant {f.variant}: {f.kind}: {f.detail}" for f in failures]
  rejected = state.rejected_of(state.iteration)
  if rejected:
    lines.append("Rejected modules (did not pass the checks):")
    lines += [f"  - {r.name} ({r.op}, variant {r.variant}): {r.reason}" for r in rejected]
  lines.append("Current pool:")
  lines.append(format_pool(state.pool))
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# LLM proposer.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class LLMProposerConfig:
  """Knobs of `LLMProposer`.

  Attributes:
    min_modules / max_modules: size of an initial pool (paper: 4–6).
    max_ops: most operations in one improvement plan.
    max_words: length hint for reflections.
    temperature: sampling temperature of proposals (reflections use 0.3 less).
  """
  min_modules: int = 4
  max_modules: int = 6
  max_ops: int = 3
  max_words: int = 250
  temperature: float = 0.8


class LLMProposer:
  """Proposer backed by an OpenAI-compatible chat API."""

  def __init__(self, client: ChatClient, config: LLMProposerConfig = LLMProposerConfig()):
    self.client = client
    self.config = config

  def _ask(self, prompt: str, *, temperature: float | None = None) -> str:
    messages = [{"role": "system", "content": prompts.SYSTEM}, {"role": "user", "content": prompt}]
    try:
      return self.client.chat(messages, temperature=temperature).text
    except Exception as e:  # noqa: BLE001 - surfaced as a proposer failure of this variant.
      raise ProposerError(f"{type(e).__name__}: {e}") from e

  def _ask_json(self, prompt: str) -> dict:
    text = self._ask(prompt, temperature=self.config.temperature)
    try:
      value = prompts.extract_json(text)
    except ValueError as e:
      raise ProposerError(str(e)) from None
    if not isinstance(value, dict):
      raise ProposerError(f"expected a JSON object, got {type(value).__name__}")
    return value

  def reflect(self, info: TaskInfo, state: PoolState, *, iteration: int) -> str:
    t = max(0.0, self.config.temperature - 0.3)
    w = self.config.max_words
    if iteration <= 1 or not state.history:
      task = self._ask(prompts.render(prompts.TASK_REFLECTION, task=info.task, max_words=w),
                       temperature=t)
      env = self._ask(prompts.render(
          prompts.ENVIRONMENT_REFLECTION, environment=info.environment, max_words=w,
          features=_features_text(info)), temperature=t)
      return f"Task reflection:\n{task.strip()}\n\nEnvironment reflection:\n{env.strip()}"
    kind = feedback_kind(state)
    return self._ask(prompts.render(prompts.FEEDBACK_REFLECTION[kind], task=info.task,
                                    iteration=state.iteration, feedback=format_feedback(state),
                                    max_words=w), temperature=t).strip()

  def _code(self, info, reflection, *, name, description, current=None) -> str:
    c = _contract(info)
    if current is None:
      prompt = prompts.render(prompts.MODULE_CODE, task=info.task, reflection=reflection,
                              contract=c, name=name, description=description)
    else:
      prompt = prompts.render(prompts.MODIFY_CODE, task=info.task, reflection=reflection,
                              contract=c, name=name, description=description, code=current)
    return prompts.extract_code(self._ask(prompt, temperature=self.config.temperature))

  def modify_code(self, info: TaskInfo, reflection: str, *, name: str, description: str,
                  code: str) -> str:
    """The LLM's edit of one module's `code` (MODIFY prompt; the reflection carries feedback).

    Used by the monolithic baseline to edit the whole best-so-far reward function.
    """
    return self._code(info, reflection, name=name, description=description, current=code)

  def init_pool(self, info: TaskInfo, reflection: str, *, iteration: int, variant: int,
                num_variants: int) -> ImprovePlan:
    cfg = self.config
    reply = self._ask_json(prompts.render(
        prompts.INIT_SPECS, task=info.task, reflection=reflection,
        contract=_contract(info), variant=variant + 1,
        num_variants=num_variants, min_modules=cfg.min_modules, max_modules=cfg.max_modules))
    specs = reply.get("modules")
    if not isinstance(specs, list) or not specs:
      raise ProposerError("initial pool reply has no 'modules' list")
    ops = []
    for spec in specs[:cfg.max_modules]:
      if not isinstance(spec, dict):
        continue
      name, desc = _clean_name(spec.get("name", "")), str(spec.get("description", ""))
      code = self._code(info, reflection, name=name, description=desc)
      ops.append(PlanOp(op="ADD", name=name, description=desc, code=code))
    return ImprovePlan(rationale="initial pool", ops=tuple(ops))

  def improve_pool(self, info: TaskInfo, pool: Pool, reflection: str, state: PoolState, *,
                   iteration: int, variant: int, num_variants: int) -> ImprovePlan:
    cfg = self.config
    reply = self._ask_json(prompts.render(
        prompts.IMPROVE_PLAN, task=info.task, reflection=reflection, pool=format_pool(pool),
        contract=_contract(info), variant=variant + 1,
        num_variants=num_variants, max_ops=cfg.max_ops))
    raw_ops = reply.get("ops")
    if not isinstance(raw_ops, list):
      raise ProposerError("plan reply has no 'ops' list")
    ops = []
    for raw in raw_ops[:cfg.max_ops]:
      if not isinstance(raw, dict):
        continue
      try:
        op = PlanOp(op=str(raw.get("op", "")), name=_clean_name(raw.get("name", "")),
                    description=str(raw.get("description", "")),
                    rationale=str(raw.get("rationale", "")))
      except ValueError as e:
        raise ProposerError(f"bad plan op {raw!r}: {e}") from None
      if op.op in ("ADD", "REWRITE") or (op.op == "MODIFY" and op.name not in pool):
        op = dataclasses.replace(op, code=self._code(info, reflection, name=op.name,
                                                     description=op.description))
      elif op.op == "MODIFY":
        op = dataclasses.replace(op, code=self._code(info, reflection, name=op.name,
                                                     description=op.description,
                                                     current=pool.get(op.name).code))
      ops.append(op)
    return ImprovePlan(rationale=str(reply.get("rationale", "")), ops=tuple(ops))

  def propose_weights(self, info: TaskInfo, pool: Pool, reflection: str, *, iteration: int,
                      variant: int, k: int) -> dict[str, float]:
    reply = self._ask_json(prompts.render(prompts.SELECT_WEIGHTS, task=info.task,
                                          reflection=reflection, pool=format_pool(pool), k=k))
    weights = reply.get("weights")
    if not isinstance(weights, dict):
      raise ProposerError("weights reply has no 'weights' object")
    out = {}
    for name, w in weights.items():
      try:
        w = float(w)
      except (TypeError, ValueError):
        continue
      if name in pool and math.isfinite(w) and w > 0:
        out[name] = w
    return out


def _clean_name(name) -> str:
  """Module names as the LLM writes them → valid identifiers ('Upright Bonus' → upright_bonus)."""
  name = re.sub(r"[^a-z0-9_]+", "_", str(name).strip().lower()).strip("_")
  if not name or not name[0].isalpha():
    name = "m_" + name
  return name[:64]


# ---------------------------------------------------------------------------------------------
# Offline proposer.
# ---------------------------------------------------------------------------------------------

# (suffix, description, code body, power) with {f} the feature, {b} a target and {a} a positive
# constant. `power` says how {a} scales with the feature: 1 for a length (|x - b| / a), 2 for a
# squared length (x² / a). Penalties (≤ 0) and bounded bonuses (in [0, 1]) are both in the
# library, so which modules help is not given away: the credit assignment still has to find out.
_SCALAR_TEMPLATES = (
    ("up", "saturating reward for increasing {f}", "jnp.tanh(f[\"{f}\"] / {a})", 1),
    ("track", "penalty on the distance of {f} from {b}", "-jnp.abs(f[\"{f}\"] - {b}) / {a}", 1),
    ("gauss", "Gaussian bonus for {f} near {b}",
     "jnp.exp(-jnp.square(f[\"{f}\"] - {b}) / {a})", 2),
    ("small", "quadratic penalty on {f}", "-jnp.square(f[\"{f}\"]) / {a}", 2),
    ("band", "bonus for {f} within {a} of {b}",
     "jnp.clip(1.0 - jnp.abs(f[\"{f}\"] - {b}) / {a}, 0.0, 1.0)", 1),
)
_VECTOR_TEMPLATES = (
    ("norm", "penalty on the norm of {f}", "-jnp.linalg.norm(f[\"{f}\"], axis=-1) / {a}", 1),
    ("energy", "quadratic penalty on {f}", "-jnp.sum(jnp.square(f[\"{f}\"]), axis=-1) / {a}", 2),
    ("near", "Gaussian bonus for {f} near zero",
     "jnp.exp(-jnp.sum(jnp.square(f[\"{f}\"]), axis=-1) / {a})", 2),
    ("band", "bonus for the norm of {f} below {a}",
     "jnp.clip(1.0 - jnp.linalg.norm(f[\"{f}\"], axis=-1) / {a}, 0.0, 1.0)", 1),
)
# Scale-aware draws: the length scale is the feature's std (floored) times log-normal(0, σ_a),
# the target its mean plus std · N(0, σ_b).
_SCALE_SIGMA = 0.5
_TARGET_SIGMA = 0.5
_MIN_SCALE = 1e-3


def render_template(template, feature: str, a: float, b: float) -> tuple[str, str, str]:
  """(name, description, code) of one library template for `feature` with constants a, b."""
  suffix, desc, body, _ = template
  fname = _clean_name(f"{feature}_{suffix}")
  text = desc.format(f=feature, a=a, b=b)
  expr = body.format(f=feature, a=a, b=b).replace(" - -", " + ")  # x - -0.2 → x + 0.2
  code = f"def {fname}(f):\n  \"\"\"{text}.\"\"\"\n  return {expr}\n"
  return fname, text, code


def _sig(x: float, digits: int = 3) -> float:
  """`x` rounded to `digits` significant digits (a short literal in module code)."""
  return float(f"{x:.{digits}g}")


def feature_scale(stats, shape: Sequence[int]) -> tuple[float, float] | None:
  """(length scale, centre) of a feature from its (mean, std) summary; None if unusable.

  Scalars: the std, or |mean| (at least `_MIN_SCALE`) for a (near-)constant feature; centre the
  mean. Vectors: the typical norm sqrt(d (mean² + std²)) of its d components; centre 0.
  """
  if stats is None:
    return None
  try:
    mean, std = (float(x) for x in stats)
  except (TypeError, ValueError):
    return None
  if not (math.isfinite(mean) and math.isfinite(std)):
    return None
  std = abs(std)
  if tuple(shape):
    d = int(np.prod(tuple(shape)))
    return max(math.sqrt(d * (mean * mean + std * std)), _MIN_SCALE), 0.0
  return (std if std >= _MIN_SCALE else max(abs(mean), _MIN_SCALE)), mean


@dataclasses.dataclass(frozen=True, kw_only=True)
class OfflineProposerConfig:
  """Knobs of `OfflineProposer`.

  Attributes:
    seed: base seed; each (iteration, variant) draws from its own stream.
    min_modules / max_modules: initial pool size.
    max_ops: most operations in one plan.
    mutation_scale: std of the log-normal factor applied to constants by MODIFY.
    extra_ops: scripted `PlanOp`s appended to every plan (e.g. for tests).
  """
  seed: int = 0
  min_modules: int = 4
  max_modules: int = 6
  max_ops: int = 2
  mutation_scale: float = 0.5
  extra_ops: tuple[PlanOp, ...] = ()


class OfflineProposer:
  """Template library + mutations; deterministic per (seed, iteration, variant), no network."""

  def __init__(self, config: OfflineProposerConfig = OfflineProposerConfig()):
    self.config = config

  def _rng(self, iteration: int, variant: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([self.config.seed, iteration, variant, purpose])

  def reflect(self, info: TaskInfo, state: PoolState, *, iteration: int) -> str:
    if iteration <= 1 or not state.history:
      return (f"Task: {info.task}\nEnvironment: {info.environment}\nFeatures:\n"
              + _features_text(info))
    return f"[{feedback_kind(state)}]\n" + format_feedback(state)

  def _draw_module(self, info: TaskInfo, rng: np.random.Generator, *, feature: str | None = None,
                   avoid: str | None = None) -> tuple[str, str, str]:
    """One templated module: (name, description, code).

    With `info.feature_stats` for the feature, constants follow its scale: a length
    L = scale · lognormal(0, 0.5) (the constant is L or L² as the template needs) and a target
    b = mean + std · N(0, 0.5) (see `feature_scale`). Without, the scale-blind draws of the
    original library: constant exp(N(0, 0.7)), target N(0, 1).
    """
    names = list(info.feature_spec)
    f = feature if feature is not None else names[int(rng.integers(len(names)))]
    shape = tuple(info.feature_spec[f])
    templates = _VECTOR_TEMPLATES if shape else _SCALAR_TEMPLATES
    choices = [t for t in templates if t[0] != avoid] or list(templates)
    suffix, desc, body, power = choices[int(rng.integers(len(choices)))]
    scale = feature_scale((info.feature_stats or {}).get(f), shape)
    if scale is None:
      a = float(np.round(np.exp(rng.normal(0.0, 0.7)), 3))
      b = float(np.round(rng.normal(0.0, 1.0), 3))
    else:
      length, centre = scale
      a = _sig((length * np.exp(rng.normal(0.0, _SCALE_SIGMA))) ** power)
      spread = 0.0 if shape else abs(float(info.feature_stats[f][1]))
      b = centre + spread * rng.normal(0.0, _TARGET_SIGMA)
      decimals = max(0, 2 - math.floor(math.log10(length)))  # ~3 digits at the feature's scale.
      b = float(f"{b:.{decimals}f}") + 0.0  # + 0.0: no "-0.0" in the code.
    return render_template((suffix, desc, body, power), f, a, b)

  def init_pool(self, info: TaskInfo, reflection: str, *, iteration: int, variant: int,
                num_variants: int) -> ImprovePlan:
    rng = self._rng(iteration, variant, 0)
    n = int(rng.integers(self.config.min_modules, self.config.max_modules + 1))
    ops, seen = [], set()
    for _ in range(8 * n):
      if len(ops) >= n:
        break
      name, desc, code = self._draw_module(info, rng)
      if name not in seen:
        seen.add(name)
        ops.append(PlanOp(op="ADD", name=name, description=desc, code=code))
    return ImprovePlan(rationale="offline template pool",
                       ops=tuple(ops) + self.config.extra_ops)

  def improve_pool(self, info: TaskInfo, pool: Pool, reflection: str, state: PoolState, *,
                   iteration: int, variant: int, num_variants: int) -> ImprovePlan:
    rng = self._rng(iteration, variant, 1)
    ops, touched = [], set()
    n_ops = int(rng.integers(1, self.config.max_ops + 1))
    size = len(pool)
    for _ in range(n_ops):
      live = [m for m in pool.modules if m.name not in touched]
      kinds = ["ADD", "MODIFY", "REWRITE"] + (["DELETE"] if size > 2 else [])
      kind = kinds[int(rng.integers(len(kinds)))] if live else "ADD"
      if kind == "ADD":
        for _ in range(8):  # The template library is small: redraw on a name clash.
          name, desc, code = self._draw_module(info, rng)
          if name not in pool and name not in touched:
            break
        else:
          kind = "MODIFY" if live else "NONE"
      if kind == "NONE":
        continue
      if kind == "ADD":
        ops.append(PlanOp(op="ADD", name=name, description=desc, code=code,
                          rationale="explore a new shaping"))
        size += 1
      elif kind == "DELETE":
        # Drop the module with the lowest credit: feedback from the hybrid credit.
        worst = min(live, key=lambda m: (pool.stats[m.name].ema_corr +
                                         pool.stats[m.name].ema_llm, m.name))
        ops.append(PlanOp(op="DELETE", name=worst.name, rationale="lowest credit"))
        size -= 1
      elif kind == "MODIFY":
        m = live[int(rng.integers(len(live)))]
        code = _perturb_constants(m.code, rng, self.config.mutation_scale)
        ops.append(PlanOp(op="MODIFY", name=m.name, description=m.description, code=code,
                          rationale="retune constants"))
      else:
        m = live[int(rng.integers(len(live)))]
        feats = module_code.validate_module_code(m.code).features
        feature = feats[0] if feats and feats[0] in info.feature_spec else None
        suffix = m.name.rsplit("_", 1)[-1]
        _, desc, code = self._draw_module(info, rng, feature=feature, avoid=suffix)
        code = _rename_function(code, m.name)
        ops.append(PlanOp(op="REWRITE", name=m.name, description=desc, code=code,
                          rationale="try another shaping of the same feature"))
      touched.add(ops[-1].name)
    return ImprovePlan(rationale="offline mutation", ops=tuple(ops) + self.config.extra_ops)

  def propose_weights(self, info: TaskInfo, pool: Pool, reflection: str, *, iteration: int,
                      variant: int, k: int) -> dict[str, float]:
    # A stand-in for the LLM's judgement: random Dirichlet weights over a random subset.
    rng = self._rng(iteration, variant, 2)
    names = list(pool.names)
    if not names:
      return {}
    chosen = rng.choice(len(names), size=min(k, len(names)), replace=False)
    w = rng.dirichlet(np.ones(len(chosen)))
    return {names[int(i)]: float(x) for i, x in zip(chosen, w)}


def _perturb_constants(code: str, rng: np.random.Generator, scale: float) -> str:
  """Multiplies every float constant outside indices by a log-normal factor.

  Results keep 4 significant digits (not decimals: a constant of a feature whose scale is 0.01
  must not round to 0).
  """
  tree = ast.parse(code)

  class Mutate(ast.NodeTransformer):

    def visit_Subscript(self, node):  # Leave f["name"] and x[..., 0] alone.
      node.value = self.visit(node.value)
      return node

    def visit_keyword(self, node):  # Leave axis=-1 etc. alone.
      return node

    def visit_Constant(self, node):
      if isinstance(node.value, float):
        return ast.copy_location(
            ast.Constant(_sig(node.value * np.exp(rng.normal(0.0, scale)), 4)), node)
      return node

  return ast.unparse(ast.fix_missing_locations(Mutate().visit(tree))) + "\n"


def _rename_function(code: str, name: str) -> str:
  tree = ast.parse(code)
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      node.name = name
  return ast.unparse(tree) + "\n"


def default_feature_docs(feature_spec: Mapping[str, Sequence[int]]) -> dict[str, str]:
  """Placeholder docs ("scalar" / "vector of 3") for features without a description."""
  return {k: ("scalar" if not tuple(v) else f"array of shape {tuple(v)}")
          for k, v in feature_spec.items()}
