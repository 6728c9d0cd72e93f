r"""Lion, Muon and the Muon + Lion split for `setup.build_optimizer` (`config.optimizer.name`).

* **Lion** (Chen et al., "Symbolic Discovery of Optimization Algorithms", arXiv 2302.06675),
  per element, with gradient g_t, momentum m, learning rate η_t, weight decay λ:

      c_t = β₁·m_{t−1} + (1 − β₁)·g_t
      u_t = sign(c_t)                       (0 where c_t = 0)
      m_t = β₂·m_{t−1} + (1 − β₂)·g_t
      θ_t = θ_{t−1} − η_t·(u_t + λ·d_t·θ_{t−1})

  with d_t = 1 (decoupled decay, `optax.lion`) or, with cautious weight decay (Chen et al.,
  "Cautious Weight Decay", arXiv 2510.12402), d_t = 1[u_t·θ_{t−1} ≥ 0]: the decay acts only
  on the coordinates whose update already shrinks |θ|.
* **Muon** (`optax.contrib.scale_by_muon`; Jordan 2024, Liu et al. arXiv 2502.16982): Nesterov
  momentum (β = `muon_beta`) of the gradient of a weight viewed as a matrix [d_in, d_out],
  orthogonalised by 5 Newton–Schulz steps, scaled by √max(1, d_out/d_in) (or, with
  `muon_consistent_rms` = r > 0, by r·√max(d_in, d_out), which gives the update an RMS of r
  like AdamW's), plus λ·d_t·θ, times −η_t. A multi-axis kernel is viewed as a matrix by
  `muon_dimension_numbers`: q/k/v `[embed, heads, head_dim]` → [embed, heads·head_dim],
  o_proj `[heads, head_dim, embed]` → [heads·head_dim, embed], a conv kernel
  `[kh, kw, c_in, c_out]` → [kh·kw·c_in, c_out]; a scanned stack's leading layer axis is a
  batch axis (one orthogonalisation per layer).
* **Muon + Lion** (Falcon Perception-HD, arXiv 2608.18881, §training): Muon on the ≥ 2-D hidden
  weights; Lion on the 1-D parameters (norm scales), the embeddings and the output heads; the
  heads at η·`head_lr_scale` (the paper: 1/√d). Which parameters are embeddings and heads is
  named by path substrings (`lion_params`, `head_params`), so the split is stated in the config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from optax import contrib

from jaxrl_post.training.phases import path_string

# Label of each parameter in the Muon + Lion split.
MUON, LION, HEAD = "muon", "lion", "head"


def muon_dimension_numbers(path: str, shape: Sequence[int]) -> contrib.MuonDimensionNumbers | None:
  """How Muon views a parameter as a matrix [d_in, d_out]; None for a < 2-D parameter.

  The output axes are the last one, except for q/k/v kernels `[embed, heads, head_dim]` (input
  `embed`, outputs heads × head_dim). The layer axis of a scanned stack (`layers/<module>/…`
  with a string after "layers", as `subspace.default_layout`) is a batch axis.
  """
  ndim = len(shape)
  parts = path.split("/")
  stacked = int("layers" in parts and parts.index("layers") + 1 < len(parts)
                and not parts[parts.index("layers") + 1].isdigit())
  if ndim - stacked < 2:
    return None
  name = parts[-1] if parts else ""
  in_ndim = 1 if name in ("q_proj", "k_proj", "v_proj") else ndim - stacked - 1
  reduction = tuple(range(stacked, stacked + in_ndim))
  output = tuple(range(stacked + in_ndim, ndim))
  return contrib.MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)


def _matches(path: str, patterns: Sequence[str]) -> bool:
  return any(p in path for p in patterns)


def muon_lion_labels(params, *, lion_params: Sequence[str], head_params: Sequence[str]):
  """The split of `params` (same tree, leaves "muon" / "lion" / "head").

  "head": the path contains a `head_params` substring; "lion": a `lion_params` substring (the
  embeddings), or fewer than 2 non-batch axes (norm scales, biases); "muon": the rest.
  """
  def label(keypath, x):
    path = path_string(keypath)
    if _matches(path, head_params):
      return HEAD
    if _matches(path, lion_params) or muon_dimension_numbers(path, x.shape) is None:
      return LION
    return MUON
  return jax.tree_util.tree_map_with_path(label, params)


def _muon_dims_tree(params):
  return jax.tree_util.tree_map_with_path(
    lambda kp, x: muon_dimension_numbers(path_string(kp), x.shape), params)


def scale_by_muon_shape(consistent_rms: float | None = None) -> optax.GradientTransformation:
  """Muon's shape factor on each ≥ 2-D update viewed as [d_in, d_out] (`muon_dimension_numbers`).

  √max(1, d_out/d_in) (Jordan 2024), or r·√max(d_in, d_out) with `consistent_rms` = r (an
  update of RMS r, arXiv 2502.16982); < 2-D leaves pass through. The same factors as the scaling
  inside `optax.contrib.muon`, which optax does not export on its own.
  """
  def scale(keypath, update):
    dims = muon_dimension_numbers(path_string(keypath), update.shape)
    if dims is None:
      return update
    fan_in = math.prod(update.shape[a] for a in dims.reduction_axis)
    fan_out = math.prod(update.shape[a] for a in dims.output_axis)
    if consistent_rms is not None:
      factor = consistent_rms * math.sqrt(max(fan_in, fan_out))
    else:
      factor = math.sqrt(max(1.0, fan_out / fan_in))
    return update * jnp.asarray(factor, update.dtype)

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(scale, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def cautious_weight_decay(weight_decay: float, *, cautious: bool
                          ) -> optax.GradientTransformation:
  """u ← u + λ·d·θ, before the learning rate: d = 1, or d = 1[u·θ ≥ 0] when `cautious`.

  `u` is the descent direction (the update before `scale_by_learning_rate` negates it), so
  u·θ ≥ 0 means the step already moves θ toward 0 (arXiv 2510.12402, Algorithm 1).
  """
  if not cautious:
    return optax.add_decayed_weights(weight_decay)

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("cautious weight decay needs the parameters: call update(g, s, params)")
    updates = jax.tree.map(
      lambda u, p: u + weight_decay * jnp.where(u * p >= 0, p, jnp.zeros_like(p)),
      updates, params)
    return updates, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def lion(schedule, opt) -> optax.GradientTransformation:
  """Lion with `opt.b1`, `opt.b2`, `opt.weight_decay` (cautious when `opt.cautious_weight_decay`)
  at `schedule`: optax.lion's chain with the decay made optionally cautious."""
  return optax.chain(
    optax.scale_by_lion(b1=opt.b1, b2=opt.b2),
    cautious_weight_decay(opt.weight_decay, cautious=opt.cautious_weight_decay),
    optax.scale_by_learning_rate(schedule))


def muon(schedule, opt) -> optax.GradientTransformation:
  """`optax.contrib.muon`: Muon on every ≥ 2-D weight (viewed by `muon_dimension_numbers`),
  optax's AdamW fallback (`b1`, `b2`, `eps`, `weight_decay`, same schedule) on the rest."""
  if opt.cautious_weight_decay:
    raise ValueError("config.optimizer.cautious_weight_decay is implemented for 'lion' and "
                     "'muon_lion'; optax.contrib.muon (name='muon') has no cautious decay")
  return contrib.muon(
    schedule, beta=opt.muon_beta, eps=opt.eps, weight_decay=opt.weight_decay,
    adam_b1=opt.b1, adam_b2=opt.b2, adam_weight_decay=opt.weight_decay,
    muon_weight_dimension_numbers=_muon_dims_tree,
    consistent_rms=opt.muon_consistent_rms or None)


def muon_lion(schedule, opt) -> optax.GradientTransformation:
  """The Falcon Perception-HD split (`muon_lion_labels`): Muon for the hidden matrices, Lion for
  the 1-D parameters and the embeddings, Lion at `head_lr_scale`·η for the heads."""
  if opt.head_lr_scale <= 0:
    raise ValueError(f"config.optimizer.head_lr_scale={opt.head_lr_scale} must be > 0")
  wd = cautious_weight_decay(opt.weight_decay, cautious=opt.cautious_weight_decay)
  muon_part = optax.chain(
    contrib.scale_by_muon(beta=opt.muon_beta, eps=opt.eps,
                          weight_dimension_numbers=_muon_dims_tree),
    scale_by_muon_shape(opt.muon_consistent_rms or None),
    wd, optax.scale_by_learning_rate(schedule))
  scale = float(opt.head_lr_scale)
  head_schedule = lambda count: scale * schedule(count)  # noqa: E731
  labels = lambda params: muon_lion_labels(  # noqa: E731
    params, lion_params=tuple(opt.lion_params), head_params=tuple(opt.head_params))
  return optax.partition(
    {MUON: muon_part, LION: lion(schedule, opt), HEAD: lion(head_schedule, opt)}, labels)


def schedule_fn(opt, total_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to `lr` over `warmup_steps`, then `opt.schedule` down to lr / 10 at
  step D = round(`decay_fraction`·total_steps), constant after D.

  "cosine": lr/10 + 0.9·lr·½(1 + cos(π·(t − w)/(D − w))); "linear": lr·(1 − 0.9·(t − w)/(D − w)).
  """
  warmup = min(int(opt.warmup_steps), max(total_steps - 1, 0))
  fraction = float(opt.get("decay_fraction", 1.0))
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"config.optimizer.decay_fraction={fraction}: expected 0 < f <= 1")
  decay_end = max(round(fraction * total_steps), warmup + 1)
  kind = opt.get("schedule", "cosine")
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else opt.lr, peak_value=opt.lr, warmup_steps=warmup,
      decay_steps=decay_end, end_value=opt.lr * 0.1)
  if kind == "linear":
    decay = optax.linear_schedule(opt.lr, opt.lr * 0.1, decay_end - warmup)
    if not warmup:
      return decay
    return optax.join_schedules([optax.linear_schedule(0.0, opt.lr, warmup), decay], [warmup])
  raise ValueError(f"config.optimizer.schedule={kind!r}: expected 'cosine' or 'linear'")
