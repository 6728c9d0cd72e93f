"""MoE step parts of the GRPO family (`methods.step_parts`): the router load-balancing loss.

`config.moe_aux_loss_coef` = c > 0 adds c · L_aux to the policy objective, where L_aux is
`models.moe.load_balancing_loss` (Switch Transformer, arXiv 2101.03961; `transformers`'
`load_balancing_loss_func`) of every sparse layer's router logits in the policy's forward
pass, over the rows' prompt + completion tokens (the attention mask), as in
`Qwen3MoeForCausalLM`'s training loss. The router logits come out of the model through
`models.moe.collect_router`, opened around the policy loss's model call at trace time, so the
loss function, the model and the train step are unchanged. Absent, None or 0 disables it.

With gradient accumulation the term is computed per micro-batch and divided by
`config.num_micro_batches`, so the accumulated objective is the mean over micro-batches of each
micro-batch's loss (as `transformers` computes it per forward pass); it is not the loss of the
whole batch at once (the product f·P is not additive over rows). Sharding over the batch does
not change it (inside `jit` the sums are global).

`config.fault` injects the two faults of the MoE-proxy study (arXiv 2608.10823 §3.3) from
step `config.fault.start_step` on (`build_fault`):

  * "logp_precision": the rollout log-probs the update compares against (`old_logp`, and
    `sampler_logp` when present) lose precision, as when a scaling factor in the rollout's
    log-prob computation is held in a low-precision format. `target="logp"` rounds each
    log-prob to `dtype` ("bfloat16", "float8_e4m3fn", "float8_e5m2"); `target="scale"`
    multiplies them by q(s)/s, the relative rounding error of the scale s = `config.fault.scale`
    (e.g. 1/T) in `dtype` (PROPOSAL: the paper names neither the factor nor the format).
    Metric `fault/logp_gap` = token-mean |faulted − clean|.
  * "no_update": actor-update omission; the update is computed (its metrics are reported) but
    the parameters and optimizer state are kept (`fault/omitted` = 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.models import moe

FAULTS = ("none", "logp_precision", "no_update")
FAULT_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def round_to(x, dtype: str) -> np.ndarray:
  """`x` rounded to `dtype` (round-to-nearest-even) and back to float32."""
  return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.dtype(dtype)).astype(jnp.float32))


class Fault:
  """Step part of `config.fault` (see the module docstring)."""

  def __init__(self, name: str, *, dtype: str, target: str, scale: float, start_step: int):
    self.name, self.dtype, self.target = name, dtype, target
    self.scale, self.start_step = float(scale), int(start_step)
    self.active = False

  def begin_step(self, method, state, step):
    del method, state
    self.active = step >= self.start_step
    return {"fault/active": float(self.active)}

  def transform(self, method, state, batch, ctx):
    del method, state, ctx
    if self.name != "logp_precision" or not self.active:
      return batch, {}
    mask = np.asarray(batch["completion_mask"], np.float32)
    out, gap = dict(batch), 0.0
    for key in ("old_logp", "sampler_logp"):
      if key not in batch:
        continue
      clean = np.asarray(batch[key], np.float32)
      if self.target == "logp":
        faulted = round_to(clean, self.dtype)
      else:
        faulted = clean * (float(round_to(self.scale, self.dtype)) / self.scale)
      out[key] = faulted.astype(np.float32)
      if key == "old_logp":
        gap = float((np.abs(faulted - clean) * mask).sum() / max(mask.sum(), 1.0))
    return out, {"fault/logp_gap": gap}

  def start(self, method, state):
    del state
    if self.name != "no_update":
      return
    inner, part = method.step_fn, self

    def step_fn(state, batch):
      if not part.active:
        return inner(state, batch)
      # The step donates its input: keep copies of what must survive it.
      kept = jax.tree.map(jnp.copy, (state.params, state.opt_state))
      new, metrics = inner(state, batch)
      return new.replace(params=kept[0], opt_state=kept[1]), dict(metrics, omitted=1)

    method.step_fn = step_fn


def build_fault(config) -> Fault | None:
  """The part of `config.fault` (None when absent or name "none").

  Raises:
    ValueError: an unknown name, dtype or target, a non-positive scale, naming the key.
  """
  knobs = config.get("fault", None)
  if knobs is None or knobs.get("name", "none") == "none":
    return None
  name = knobs.get("name")
  if name not in FAULTS:
    raise ValueError(f"config.fault.name={name!r} is not one of {FAULTS}")
  dtype, target = knobs.get("dtype", "bfloat16"), knobs.get("target", "logp")
  if dtype not in FAULT_DTYPES:
    raise ValueError(f"config.fault.dtype={dtype!r} is not one of {FAULT_DTYPES}")
  if target not in ("logp", "scale"):
    raise ValueError(f"config.fault.target={target!r} is not one of ('logp', 'scale')")
  scale = knobs.get("scale", 1 / 0.7)
  if not scale > 0:
    raise ValueError(f"config.fault.scale={scale!r} must be > 0")
  return Fault(name, dtype=dtype, target=target, scale=scale,
               start_step=knobs.get("start_step", 0))


class MoeAuxLoss:
  """Step part: `wrap_loss` adds `coef · L_aux / num_micro_batches` (metric `moe_aux_loss`)."""

  shared_keys = ()

  def __init__(self, coef: float, num_micro_batches: int):
    self.coef, self.num_micro_batches = float(coef), int(num_micro_batches)

  def wrap_loss(self, policy_loss):
    coef, parts = self.coef, self.num_micro_batches

    def loss(model, batch):
      with moe.collect_router() as records:
        value, aux = policy_loss(model, batch)
      c = model.config
      if not records.calls:
        raise ValueError(f"config.moe_aux_loss_coef={coef} needs a Mixture-of-Experts policy "
                         f"(num_experts > 0); config.model has family {c.family!r} and "
                         f"num_experts={c.num_experts}")
      lb = moe.records_aux_loss(records, num_experts=c.num_experts, top_k=c.num_experts_per_tok)
      return value + coef * lb / parts, dict(aux, moe_aux_loss=lb / parts)

    return loss


def build_moe_aux_loss(config) -> MoeAuxLoss | None:
  """The part for `config.moe_aux_loss_coef` (None when absent, None or 0).

  Raises:
    ValueError: a negative or non-numeric coefficient, naming the key.
  """
  coef = config.get("moe_aux_loss_coef", None)
  if coef is None:
    return None
  if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
    raise ValueError(f"config.moe_aux_loss_coef={coef!r} must be a number >= 0 (0 disables)")
  if coef == 0:
    return None
  return MoeAuxLoss(coef, config.get("num_micro_batches", 1))


class MoeStepPart:
  """The one `step_parts` entry of this module: the aux loss and / or the fault, together."""

  shared_keys = ()

  def __init__(self, aux: MoeAuxLoss | None, fault: Fault | None):
    self.aux, self.fault = aux, fault

  def wrap_loss(self, policy_loss):
    return policy_loss if self.aux is None else self.aux.wrap_loss(policy_loss)

  def begin_step(self, method, state, step):
    return {} if self.fault is None else self.fault.begin_step(method, state, step)

  def transform(self, method, state, batch, ctx):
    return (batch, {}) if self.fault is None else self.fault.transform(method, state, batch, ctx)

  def start(self, method, state):
    if self.fault is not None:
      self.fault.start(method, state)


def build_moe_step_part(config) -> MoeStepPart | None:
  """`config.moe_aux_loss_coef` and `config.fault` as one part (None when both are off)."""
  aux, fault = build_moe_aux_loss(config), build_fault(config)
  return None if aux is None and fault is None else MoeStepPart(aux, fault)
