"""Train state and the jitted update step (gradient accumulation, non-finite guard).

  state = create_train_state(model, optimizer, rng, mesh=mesh)   # born sharded
  step_fn = make_train_step(graphdef, loss_fn, optimizer, num_micro_batches=4)
  state, metrics = step_fn(state, batch)                          # state is donated

`loss_fn(model, micro_batch) -> (loss, aux)` must be *additive* over
micro-batches: normalise by counts of the whole batch (passed in the batch,
e.g. `batch["num_tokens"]`), not of the micro-batch. Then summing the
micro-batch losses and gradients gives exactly the full-batch values, which
is what `jaxrl_post.losses` does with its global normalisers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, axis_rules, state_shardings


@flax.struct.dataclass
class TrainState:
  """Everything an update needs and a checkpoint saves.

  Attributes:
    step: `int32[]`, completed updates.
    params: the model's `nnx.Param` state.
    opt_state: optax state.
    rng: `uint32[2]` PRNG key data (raw, so checkpoints stay plain arrays).
    nonfinite_streak: `int32[]`, consecutive updates skipped for a non-finite
      loss or gradient (reset by a finite one).
    nonfinite_total: `int32[]`, all skipped updates.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  nonfinite_streak: jax.Array
  nonfinite_total: jax.Array

  @property
  def key(self) -> jax.Array:
    return jax.random.wrap_key_data(self.rng)


def create_train_state(model: nnx.Module, optimizer: optax.GradientTransformation,
                       rng: jax.Array, *, mesh: Mesh | None = None,
                       rules: Rules = DEFAULT_RULES, trainable: Any = nnx.Param) -> TrainState:
  """Builds the train state from `model`'s parameters; sharded when `mesh` is given.

  Shapes first (`jax.eval_shape`), then shardings from the parameters'
  logical axes, then one jitted initialiser with those `out_shardings`: the
  optimizer state is born sharded like the parameters it mirrors.

  `trainable`: an `nnx` filter of the variables the state trains (its `params`, and the only
  ones the optimizer keeps state for). `models.lora.LoraParam` trains the adapters alone; the
  rest of the model is then the frozen input of `make_train_step(frozen=...)`.
  """
  params = nnx.state(model, trainable)

  def init(params):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=jax.random.key_data(rng),
                      nonfinite_streak=jnp.zeros((), jnp.int32),
                      nonfinite_total=jnp.zeros((), jnp.int32))

  if mesh is None:
    return jax.jit(init)(params)
  shardings = train_state_shardings(jax.eval_shape(init, params), mesh, rules)
  params = jax.device_put(params, shardings.params)
  return jax.jit(init, out_shardings=shardings)(params)


def train_state_shardings(abstract: TrainState, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Shardings of a (possibly abstract) `TrainState`: optimizer moments follow
  their parameters, scalars and the RNG are replicated."""
  param_shardings = state_shardings(abstract.params, mesh, rules)
  replicated = NamedSharding(mesh, PartitionSpec())
  by_shape = {}
  for variable, sharding in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(param_shardings)):
    by_shape.setdefault(variable.shape, sharding)

  def opt_sharding(x):
    # Adam's mu / nu have the shapes of the parameters (not always their dtype:
    # float32 moments of bf16 parameters); anything else (counts) is
    # replicated. Parameters of equal shape share logical axes here.
    return by_shape.get(x.shape, replicated) if x.ndim else replicated

  shardings = TrainState(step=replicated, params=param_shardings,
                         opt_state=jax.tree.map(opt_sharding, abstract.opt_state),
                         rng=replicated, nonfinite_streak=replicated, nonfinite_total=replicated)
  return jax.tree.map(_canonical, shardings)


def _canonical(sharding: NamedSharding) -> NamedSharding:
  """The spec without trailing Nones: the form a jitted step's outputs come back in.

  `P('fsdp', 'tensor', None)` and `P('fsdp', 'tensor')` place the same data, but
  jit's cache tells them apart; a state born with the first would make the
  second update compile the step again.
  """
  spec = list(sharding.spec)
  while spec and spec[-1] is None:
    spec.pop()
  return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


def _split_micro_batches(batch, num_micro_batches: int):
  def split(x):
    if x.shape[0] % num_micro_batches:
      valid = [m for m in range(1, x.shape[0] + 1) if x.shape[0] % m == 0]
      raise ValueError(f"num_micro_batches={num_micro_batches} does not divide the batch of "
                       f"{x.shape[0]} rows; valid values: {valid}")
    return x.reshape(num_micro_batches, x.shape[0] // num_micro_batches, *x.shape[1:])

  return jax.tree.map(split, batch)


def make_train_step(graphdef, loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                    num_micro_batches: int = 1, mesh: Mesh | None = None,
                    rules: Rules = DEFAULT_RULES, shared: Any = None, frozen: Any = None):
  """A jitted `(state, batch) -> (state, metrics)` with the state donated.

  Args:
    graphdef: `nnx.split(model)[0]`; with `frozen`, the graph of
      `nnx.split(model, trainable, ...)` (`graphdef, state.params, frozen`).
    loss_fn: `(model, micro_batch) -> (loss, aux dict)`, additive over
      micro-batches (see the module docstring).
    optimizer: optax transformation.
    num_micro_batches: gradient accumulation; rows of every batch array are
      split into this many consecutive chunks, scanned with summed gradients.
    mesh, rules: activation sharding context inside the step.
    shared: optional keys of `batch` that are not split (global scalars).
    frozen: optional state of the variables the step does not train (a LoRA run's base
      model): the model is `nnx.merge(graphdef, state.params, frozen)`, and only
      `state.params` are differentiated. It is an argument of the jitted
      `(state, batch, frozen)` (neither donated nor a compile-time constant), closed over by
      the returned `(state, batch)` function, whose `lower(state, batch)` lowers it.

  Returns:
    The step. Metrics: `loss`, the summed aux, `grad_norm`, `param_norm`,
    `update_norm` (0 on a skipped step), `skipped` (1 when a non-finite loss or gradient made the
    step keep the old parameters), `nonfinite_streak`.
  """
  shared = tuple(shared or ())

  def loss_of_params(params, micro_batch, frozen):
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    return loss_fn(model, micro_batch)

  # Only argument 0 (the trainable params) is differentiated: no gradient of a frozen kernel.
  grad_fn = jax.value_and_grad(loss_of_params, has_aux=True)

  def step(state: TrainState, batch, frozen=None):
    context = axis_rules(mesh, rules) if mesh is not None else _nullcontext()
    with context:
      common = {k: batch[k] for k in shared}
      split = _split_micro_batches({k: v for k, v in batch.items() if k not in shared},
                                   num_micro_batches)

      def accumulate(carry, micro_batch):
        (loss, aux), grads = grad_fn(state.params, micro_batch | common, frozen)
        total_loss, total_aux, total_grads = carry
        return (total_loss + loss, jax.tree.map(jnp.add, total_aux, aux),
                jax.tree.map(lambda t, g: t + g.astype(t.dtype), total_grads, grads)), None

      first = jax.tree.map(lambda x: x[0], split)
      abstract_aux = jax.eval_shape(lambda p: loss_of_params(p, first | common, frozen)[1],
                                    state.params)
      # Gradients of bf16 parameters are summed in float32 (one rounding at the
      # end, not one per micro-batch).
      zeros = (jnp.zeros((), jnp.float32), jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                                        abstract_aux),
               jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)),
                            state.params))
      (loss, aux, grads), _ = jax.lax.scan(accumulate, zeros, split)
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

      grad_norm = optax.tree.norm(grads)
      finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

      # A non-finite loss or gradient skips the optimizer altogether (a NaN must
      # not leak into Adam's moments). As a `cond`, not a `where(finite, new,
      # old)` over every leaf: the selects made a copy of every parameter and
      # moment per step, which cost time on CPU and memory everywhere.
      def apply(operand):
        params, opt_state = operand
        updates, opt_state = optimizer.update(grads, opt_state, params)
        norm = optax.tree.norm(updates).astype(jnp.float32)
        return optax.apply_updates(params, updates), opt_state, norm

      def skip(operand):
        params, opt_state = operand
        return params, opt_state, jnp.zeros((), jnp.float32)

      new_params, new_opt_state, update_norm = jax.lax.cond(
        finite, apply, skip, (state.params, state.opt_state))
      streak = jnp.where(finite, 0, state.nonfinite_streak + 1)
      new_state = TrainState(
        step=state.step + finite.astype(jnp.int32), params=new_params,
        opt_state=new_opt_state, rng=state.rng,
        nonfinite_streak=streak, nonfinite_total=state.nonfinite_total + (~finite))
      metrics = dict(aux, loss=loss, grad_norm=grad_norm,
                     param_norm=optax.tree.norm(state.params),
                     update_norm=update_norm,
                     skipped=(~finite).astype(jnp.int32), nonfinite_streak=streak)
      return new_state, metrics

  jitted = jax.jit(step, donate_argnums=(0,))
  if frozen is None:
    return jitted

  def step_with_frozen(state: TrainState, batch):
    return jitted(state, batch, frozen)

  step_with_frozen.lower = lambda state, batch: jitted.lower(state, batch, frozen)
  return step_with_frozen


class _nullcontext:
  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False
