"""CD-RFT (arXiv 2608.08224) in a GRPO step: the shared-control-bottleneck penalty.

`config.control.name = "cd_rft"` adds to the GRPO loss

  L = L_GRPO(θ) + γ · SCB(K),   K[c, f] = Σ_{i ∈ c} sg(g_f,i) · (θ_i − θ⁰_i)   `[M, F]`

(`losses.cd_rft.control_matrix`, `losses.cd_rft.scb`). Families f are the domains of the task
mixture (arith, countdown, format: `MixtureTask.domains`); g_f is the gradient of this
update's policy loss restricted to family f's rows, taken at sg(θ); components c are the
per-layer attention and MLP blocks (`losses.cd_rft.component_ids`); θ⁰ is the starting policy.
SCB is 1 when every family's reward gain is controlled by the same components and 0 when the
control profiles are disjoint; the penalty pushes the families' updates apart.

How it is computed, per update:

* `transform` adds `cd_rft_family` (int32 `[rows]`, the row's domain id; rows are record-major,
  `group_size` per record) and `cd_rft_ref` (θ⁰ as a nested dict of device arrays).
* Inside the loss, one extra backward pass per family: `jax.grad` of the wrapped policy loss
  with `completion_mask` zeroed outside family f's rows, at `stop_gradient(θ)`. The batch's
  global `num_tokens` / `num_sequences` are kept, so the family losses add up to the policy
  loss and Σ_f g_f = g. The policy loss must weight rows through `completion_mask` (as
  `training.objectives.make_policy_loss` does). The cost is F extra forward + backward passes
  per update (the paper's "families as micro-batches" gets them for free; here the step has one
  mixed batch).
* The penalty is first-order: g_f is held constant, so its gradient flows only through
  Δθ = θ − θ⁰: ∂/∂θ_i = γ Σ_f ∂SCB/∂K[c(i), f] · g_f,i (no Hessian-vector product). At the
  first update Δθ = 0, K = 0 and the penalty and its gradient are 0.
* SCB is invariant to scaling a column of K, hence of degree 0 in Δθ: its gradient scales as
  1/‖Δθ‖. In the first updates after θ⁰ it can be far larger than the policy gradient (runlocal:
  a gradient norm of ≈ 60 against ≈ 0.1 at γ = 0.1), and the optimizer's global-norm clipping
  then lets the penalty set the update's direction. Read γ against this.
* K is built one family column at a time (`control_matrix` on a single family) in a
  `lax.scan` over the families: one family gradient is live at a time, not F copies of the
  parameters, and the extra backward pass is compiled once.

θ⁰ enters the compiled step as an input, not a constant: it is a *shared* batch key
(`shared_keys`), placed with the batch each update and not split over micro-batches. A closure
over device arrays would not do: `jax.jit` (JAX 0.10) embeds closed-over arrays in the program
as literal constants (checked: a closed-over 4 MB array appears as a `dense<...>` constant in
the lowered text), which for a model means a second copy of the weights in every compiled
program. Because shared keys pass through the PPO phase only whole, the method needs
`config.ppo_mini_batches = 1`; because SCB is not additive over micro-batches (a cosine of the
whole update's control columns), it needs `config.num_micro_batches = 1`. Both are config
errors naming the key (no per-micro-batch approximation).

θ⁰ is not checkpointed: `start` receives the starting policy, also on a restart from the
workdir (`training.setup.build_run` builds the model from where the run first started).

Families with no control in an update (no rows in the batch, or rows whose gradient is 0) have
an all-zero column, which `scb` counts as cosine 0 with every other column. PROPOSAL
`inactive="skip"` (default) averages the cosines over the pairs of *active* families only:
SCB · F(F−1) / (n(n−1)) with n the active columns (SCB = 0 when n < 2), so the statistic does
not drift with the batch's family mix; `inactive="zero"` keeps the plain F-family mean.

Logged (per update, averaged by the PPO phase): `train/cd_rft_scb`, `train/cd_rft_penalty`
(γ·SCB, also with γ = 0, the matched-GRPO arm of the sweep) and `train/cd_rft_families` (n).
The activation concentration (ACB) and the activation–control gap are not logged: they need
per-component activation magnitudes, which the model's forward pass does not expose.

Config section `control` (PROPOSAL values, the paper gives none):
  name          "cd_rft" | "none"
  gamma         PROPOSAL 0.01 (swept over {0, 0.01, 0.1}); 0 keeps the diagnostics only
  granularity   PROPOSAL "block" (per-layer attention and MLP blocks) | "leaf"
  others        PROPOSAL "exclude" (embeddings, norms, lm_head outside K) | "separate"
  inactive      PROPOSAL "skip" | "zero" (see above)
  scale         "none" (the spec's γ·SCB) | "displacement" (γ·sg(‖Δθ_K‖)·SCB, this project's
                variant whose gradient does not grow near θ⁰; see `control_loss`)

References:
  arXiv 2608.08224, "Control-Diverse Reinforcement Fine-Tuning: Decoupling the Shared Control
  Bottleneck of RL Post-Training".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.losses import cd_rft

CONTROL_NAMES = ("none", "cd_rft")
INACTIVE_MODES = ("skip", "zero")
# PROPOSAL: absent families are left out of SCB's pair mean.
INACTIVE = "skip"
SCALES = ("none", "displacement")
# The spec's penalty, γ·SCB; "displacement" is this project's variant (see `control_loss`).
SCALE = "none"
FAMILY_KEY = "cd_rft_family"
REF_KEY = "cd_rft_ref"


def family_ids(task, records: Sequence[Mapping[str, Any]], group_size: int) -> np.ndarray:
  """Per-row family ids `[len(records) × group_size]` (record-major, as the step's rollout):
  the index of each record's domain in `task.domains`.

  Examples:
    >>> from jaxrl_post.tasks.mixture import MixtureTask
    >>> task = MixtureTask()
    >>> records = [task.make_example("train", i) for i in range(3)]  # arith, countdown, format
    >>> family_ids(task, records, 2).tolist()
    [0, 0, 1, 1, 2, 2]
  """
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}")
  index = {d: i for i, d in enumerate(task.domains)}
  ids = np.asarray([index[task.domain_of(r)] for r in records], np.int32)
  return np.repeat(ids, group_size)


def active_scb(control: jax.Array, *, inactive: str = INACTIVE) -> tuple[jax.Array, jax.Array]:
  """SCB of K `[M, F]` with inactive (all-zero) family columns handled by `inactive`.

  `scb` counts an all-zero column as cosine 0 with every other, so the sum over all pairs is
  the sum over pairs of active columns; "skip" rescales the mean to those n(n−1)/2 pairs:
  SCB_active = SCB · F(F−1) / (n(n−1)), 0 when n < 2. "zero" returns `scb(K)`.

  Args:
    control: K `[M, F]`, F ≥ 2.
    inactive: PROPOSAL "skip" (default) or "zero".

  Returns:
    `(scb, n)`: `[]` float32 each, n the number of active families.

  Examples:
    >>> k = jnp.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # family 2 inactive
    >>> s, n = active_scb(k)
    >>> round(float(s), 4), float(n), round(float(active_scb(k, inactive="zero")[0]), 4)
    (0.7071, 2.0, 0.2357)
  """
  if inactive not in INACTIVE_MODES:
    raise ValueError(f"inactive must be one of {INACTIVE_MODES}; got {inactive!r}")
  value = cd_rft.scb(control)
  f = control.shape[1]
  n = jnp.sum(jnp.sum(jnp.abs(control), axis=0) > 0).astype(jnp.float32)
  if inactive == "zero":
    return value, n
  scale = f * (f - 1) / jnp.maximum(n * (n - 1), 1.0)
  return jnp.where(n >= 2, value * scale, 0.0), n


def control_loss(policy_loss: Callable, ids: Any, num_components: int, num_families: int, *,
                 gamma: float = cd_rft.GAMMA, inactive: str = INACTIVE,
                 scale: str = SCALE) -> Callable:
  """`policy_loss` plus γ·SCB(K) over the batch's families: `(model, batch) -> (loss, aux)`.

  The batch carries, besides the policy loss's keys, `cd_rft_family` int `[rows]` (ids in
  [0, num_families)) and `cd_rft_ref`, θ⁰ as a nested dict like `nnx.to_pure_dict` of the
  model's `nnx.Param` state. g_f = ∇_θ policy_loss(θ, batch with `completion_mask` zeroed off
  family f) at sg(θ), F extra backward passes; K[c, f] = Σ_{i∈c} g_f,i (θ_i − θ⁰_i); the
  penalty's gradient flows through θ − θ⁰ only.

  Args:
    policy_loss: `(model, batch) -> (loss, aux)`; rows weighted through `completion_mask`.
    ids, num_components: `losses.cd_rft.component_ids` of the model's parameters (host
      constants, baked into the program: they are small).
    num_families: F ≥ 2.
    gamma: PROPOSAL penalty weight γ (default 0.01).
    inactive: PROPOSAL handling of families without control, see `active_scb`.
    scale: "none" (the spec's γ·SCB) or "displacement", this project's variant
      γ·sg(‖Δθ_K‖₂)·SCB (`losses.cd_rft.controlled_displacement_norm`). SCB is of degree 0 in
      Δθ, so the plain penalty's gradient grows as 1/‖Δθ‖ and, near θ⁰, dominates the
      update's direction (AdamW normalises its size); the scaled penalty has a gradient of
      degree 0 in Δθ, so γ sets its size against the policy gradient's all run long. Same minimisers
      over directions of Δθ; the value logged is the scaled one.

  Returns:
    The loss; its aux adds `cd_rft_scb`, `cd_rft_penalty` and `cd_rft_families`.

  References:
    arXiv 2608.08224, "Control-Diverse Reinforcement Fine-Tuning: Decoupling the Shared Control
    Bottleneck of RL Post-Training".
  """
  if num_families < 2:
    raise ValueError(f"num_families must be >= 2 (SCB compares families); got {num_families}")
  if inactive not in INACTIVE_MODES:
    raise ValueError(f"inactive must be one of {INACTIVE_MODES}; got {inactive!r}")
  if scale not in SCALES:
    raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")

  def loss(model, batch):
    value, aux = policy_loss(model, batch)
    family = batch[FAMILY_KEY]
    mask = batch["completion_mask"]
    if family.shape != mask.shape[:1]:
      raise ValueError(f"batch[{FAMILY_KEY!r}] must be [rows={mask.shape[0]}]; got "
                       f"{tuple(family.shape)}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    frozen = jax.lax.stop_gradient(params)
    theta = nnx.to_pure_dict(params)
    delta = jax.tree.map(lambda p, r: p - r.astype(p.dtype), theta, batch[REF_KEY])

    def fam_loss(p, fam_batch):
      return policy_loss(nnx.merge(graphdef, p, rest), fam_batch)[0]

    def column(carry, f):
      rows = (family == f)[:, None]
      fam_batch = dict(batch, completion_mask=jnp.where(rows, mask, jnp.zeros_like(mask)))
      grads = nnx.to_pure_dict(jax.grad(fam_loss)(frozen, fam_batch))
      return carry, cd_rft.control_matrix([grads], delta, ids, num_components)[:, 0]

    # A scan over the families, not a Python loop: the extra backward pass is compiled once
    # (not F times), and one family gradient is live at a time.
    _, columns = jax.lax.scan(column, None, jnp.arange(num_families, dtype=family.dtype))
    control = columns.T
    s, n = active_scb(control, inactive=inactive)
    penalty = gamma * s
    if scale == "displacement":
      penalty = penalty * jax.lax.stop_gradient(cd_rft.controlled_displacement_norm(delta, ids))
    return value + penalty, dict(aux, cd_rft_scb=s, cd_rft_penalty=penalty, cd_rft_families=n)

  return loss


class ControlRegularizer:
  """CD-RFT's penalty as a GRPO step part; see the module docstring."""

  # θ⁰ is one value for the whole update, not rows to split.
  shared_keys = (REF_KEY,)

  def __init__(self, config, task):
    knobs = config.control
    if config.num_micro_batches != 1:
      raise ValueError(f"config.control.name='cd_rft' needs config.num_micro_batches = 1, got "
                       f"{config.num_micro_batches} (SCB is not additive over micro-batches)")
    if config.ppo_mini_batches != 1:
      raise ValueError(f"config.control.name='cd_rft' needs config.ppo_mini_batches = 1, got "
                       f"{config.ppo_mini_batches} (θ⁰ is a shared batch key, passed whole)")
    domains = tuple(getattr(task, "domains", ()))
    if len(domains) < 2:
      raise ValueError(f"config.control.name='cd_rft' needs a task with >= 2 families: "
                       f"config.task must be 'mixture' with >= 2 domains; got "
                       f"config.task={config.task!r} with domains {domains}")
    if not np.isfinite(knobs.gamma) or knobs.gamma < 0:
      raise ValueError(f"config.control.gamma must be >= 0, got {knobs.gamma}")
    if knobs.granularity not in cd_rft.GRANULARITIES:
      raise ValueError(f"config.control.granularity={knobs.granularity!r}; valid: "
                       f"{', '.join(cd_rft.GRANULARITIES)}")
    if knobs.others not in ("exclude", "separate"):
      raise ValueError(f"config.control.others={knobs.others!r}; valid: exclude, separate")
    if knobs.inactive not in INACTIVE_MODES:
      raise ValueError(f"config.control.inactive={knobs.inactive!r}; valid: "
                       f"{', '.join(INACTIVE_MODES)}")
    # Configs written before the knob existed mean the spec's penalty.
    self.scale = knobs.get("scale", SCALE)
    if self.scale not in SCALES:
      raise ValueError(f"config.control.scale={self.scale!r}; valid: {', '.join(SCALES)}")
    self.config, self.knobs, self.task, self.domains = config, knobs, task, domains
    self.reference = None
    self.names: list[str] = []

  def wrap_loss(self, policy_loss):
    """`policy_loss` plus γ·SCB; component ids come from the model at trace time."""
    knobs, cache = self.knobs, {}

    def loss(model, batch):
      # The parameter tree is only known once a model is traced; its component map is host
      # work done once per structure.
      params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
      key = jax.tree.structure(params)
      if key not in cache:
        ids, m, names = cd_rft.component_ids(params, granularity=knobs.granularity,
                                             others=knobs.others)
        if m < 1:
          raise ValueError(f"config.control.granularity={knobs.granularity!r} with "
                           f"others={knobs.others!r} finds no components in the model")
        self.names = names
        cache[key] = control_loss(policy_loss, ids, m, len(self.domains), gamma=knobs.gamma,
                                  inactive=knobs.inactive, scale=self.scale)
      return cache[key](model, batch)

    return loss

  def start(self, method, state) -> None:
    """Keeps θ⁰, the starting policy (the same after a restart)."""
    del method
    self.reference = nnx.to_pure_dict(jax.tree.map(jnp.copy, state.params))

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: adds the rows' family ids and θ⁰ to the batch."""
    del method, state
    ids = family_ids(self.task, ctx.records, self.config.group_size)
    rows = len(batch["completion_mask"])
    if rows != len(ids):
      raise ValueError(f"config.control.name='cd_rft' needs one batch row per rollout of the "
                       f"step ({len(ids)}); the batch has {rows} (a part that adds rows, such "
                       f"as replay, does not compose with it)")
    counts = np.bincount(ids, minlength=len(self.domains))
    metrics = {f"cd_rft/rows_{d}": float(c) for d, c in zip(self.domains, counts)}
    return batch | {FAMILY_KEY: ids, REF_KEY: self.reference}, metrics



def build_control_regularizer(config, task):
  """The configured control regulariser (`config.control.name`), or None ("none")."""
  knobs = config.get("control")
  name = "none" if knobs is None else knobs.name
  if name not in CONTROL_NAMES:
    raise ValueError(f"config.control.name={name!r}; valid: {', '.join(CONTROL_NAMES)}")
  return ControlRegularizer(config, task) if name == "cd_rft" else None
