"""Multi-LoRA: several RL runs ("tenants") at once, each training its own low-rank adapters on one
frozen base model held once in device memory (Miles v0.1's multi-LoRA training; the shared-base
idea of m-LoRA / ASPEN, arXiv 2312.02515; LoRA itself arXiv 2106.09685).

A tenant is a whole GRPO-family run of its own — its task, data stream, seed, loss, optimizer,
learning-rate schedule, reference, evaluation and metrics — except for what the base model
fixes (`SHARED_KEYS`: the model, the adapters' rank / targets, the mesh, the step count and the
loop's cadence). Its config is the run's config with `config.multi_lora.tenants.<name>`'s
overrides applied (nested dicts, e.g. `{"seed": 1, "task_knobs": {"operations": "-"}}`).

Memory: one base (B parameters) + Σ_tenants (adapters + their optimizer moments), against
N·(B + moments of B) for N full fine-tuning runs, or N·B for N single-LoRA runs in N processes.

What is shared and what is not:
  * the frozen base (`run.frozen`): one copy, read by every tenant's scorer and update;
  * the train state: one `TrainState` per tenant (adapters, optimizer state, step and RNG),
    kept together as one `TrainState` whose fields are `{tenant: value}` dicts (`stack_states`)
    so the loop checkpoints and restores it as one pytree, and exports pick a tenant's
    adapters (`scripts/export_hf.py --adapter=<name>`, merged into the base);
  * the compute: the tenants' steps run one after another, each with its own compiled update
    (same shapes compile the same program: XLA's cache is per process, not shared between the
    tenants' `jit`s); sampling merges a tenant's adapters into a transient copy of the base
    (`models.lora.merge_adapters`) and decodes with the base graph. No fused multi-adapter
    batch (one forward over all tenants' rows with per-row adapters) is built: the saving here
    is memory, not FLOPs.

A tenant given the same config as a single-LoRA run follows that run exactly: its adapters are
drawn from `fold_in(key(seed), rank)` as the loop draws them, its train state's RNG is
`key(seed)`, its data and rollouts are seeded by its own config (tests check this bitwise).

Metrics: each tenant's `train/x`, `eval/x`, `rollout/x`, `time/x` are logged as
`train/<tenant>/x` etc.; `train/nonfinite_streak` is the largest tenant's (the loop's guard).
Each tenant writes its held-out outcomes under `<workdir>/tenants/<tenant>/`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
from flax import nnx

from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.models.lora import LoraParam, add_lora, without_lora
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.train_state import TrainState, create_train_state

# Config keys a tenant cannot override: the base model and its adapters' shapes, the meshes, the
# start / resume point, and the loop's cadence (one loop runs every tenant's steps).
SHARED_KEYS = frozenset({
  "model", "model_overrides", "dtype", "param_dtype", "lora", "mesh", "init_from", "resume",
  "tokenizer", "steps", "log_every", "eval_every", "eval_at_start", "checkpoint_every",
  "keep_checkpoints", "max_nonfinite_streak", "metric_writers", "wandb_project",
  "profile_steps", "profile_all_processes", "compilation_cache_dir", "reward_workers",
  "multi_lora",
})
# Where each tenant writes its own files (held-out outcomes), under the run's workdir.
TENANTS_DIR = "tenants"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _override(node, overrides: Mapping[str, Any], where: str) -> None:
  """Applies nested `overrides` to ConfigDict `node` in place; unknown keys raise."""
  for key, value in overrides.items():
    if key not in node:
      raise ValueError(f"{where}.{key}: the run's config has no key {key!r} there; a tenant "
                       f"overrides existing keys only")
    # A ConfigDict is not a `Mapping`: the tenants' nested overrides arrive as ConfigDicts.
    nested = isinstance(value, (Mapping, ml_collections.ConfigDict))
    if nested and isinstance(node[key], ml_collections.ConfigDict):
      _override(node[key], value, f"{where}.{key}")
    else:
      node[key] = value


def tenant_configs(config) -> dict[str, ml_collections.ConfigDict]:
  """`{tenant: its config}`: `config` with `config.multi_lora.tenants.<tenant>` applied.

  Raises:
    ValueError: naming the key: no `config.multi_lora.tenants` (or an empty one),
      `config.lora.rank` = 0 (multi-LoRA trains adapters), a tenant name that is not an
      identifier (letters, digits, `_`, `-`; it names metric keys and directories), a tenant
      override of a `SHARED_KEYS` key or of a key the config does not have.
  """
  block = config.get("multi_lora")
  tenants = None if block is None else block.get("tenants")
  if not tenants:
    raise ValueError("config.multi_lora.tenants is empty: name at least one tenant, e.g. "
                     "{'plus': {'task_knobs': {'operations': '+'}}, 'minus': {...}}")
  lora = config.get("lora") or {}
  if not int(lora.get("rank", 0)):
    raise ValueError("config.lora.rank=0: multi-LoRA trains one adapter per tenant on a frozen "
                     "base; set config.lora.rank > 0")
  out = {}
  for name, overrides in tenants.items():
    where = f"config.multi_lora.tenants.{name}"
    if not _NAME.match(name):
      raise ValueError(f"{where}: a tenant name must start with a letter and hold only letters, "
                       "digits, '_' and '-' (it names metric keys and directories)")
    shared = sorted(SHARED_KEYS.intersection(overrides or {}))
    if shared:
      raise ValueError(f"{where}: {shared} are shared by every tenant (the base model, the "
                       f"loop's cadence); set them on the run's config instead")
    tenant = ml_collections.ConfigDict(config.to_dict())
    _override(tenant, dict(overrides or {}), where)
    tenant.lock()
    out[name] = tenant
  return out


def stack_states(states: Mapping[str, TrainState]) -> TrainState:
  """One `TrainState` whose fields are `{tenant: field}` dicts (what the loop checkpoints)."""
  return TrainState(**{f.name: {n: getattr(s, f.name) for n, s in states.items()}
                       for f in dataclasses.fields(TrainState)})


def tenant_state(state: TrainState, name: str) -> TrainState:
  """Tenant `name`'s own `TrainState` out of `stack_states`' combined one."""
  return TrainState(**{f.name: getattr(state, f.name)[name]
                       for f in dataclasses.fields(TrainState)})


def tenant_key(key: str, name: str) -> str:
  """`train/loss` → `train/<name>/loss` (a key without `/` becomes `<name>/key`)."""
  head, sep, rest = key.partition("/")
  return f"{head}/{name}/{rest}" if sep else f"{name}/{key}"


def tenant_records(records: Sequence[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
  """The metrics history of tenant `name` with its own keys (`tenant_key` undone)."""
  out = []
  for record in records:
    own = {}
    for key, value in record.items():
      head, sep, rest = key.partition("/")
      if sep and rest.startswith(f"{name}/"):
        own[f"{head}/{rest[len(name) + 1:]}"] = value
    if own:
      out.append({"step": record.get("step"), **own})
  return out


class MultiLoRA:
  """Several adapters' GRPO-family runs on one frozen base; a `training.loop.Method`.

  `make_tenant(config) -> method` builds a tenant's method (default `GRPO`); it must support
  LoRA and have GRPO's `build_parts(task, tokenizer)` (a model built once, then shared).
  """

  name = "multi_lora"
  supports_lora = True

  def __init__(self, config, make_tenant: Callable[[Any], Any] = GRPO):
    self.config = config
    self.configs = tenant_configs(config)
    self.tenants = {name: make_tenant(c) for name, c in self.configs.items()}
    for name, tenant in self.tenants.items():
      if not getattr(tenant, "supports_lora", False) or not hasattr(tenant, "build_parts"):
        raise ValueError(f"config.multi_lora.tenants.{name}: method {tenant.name!r} cannot be "
                         "a tenant (it needs `supports_lora` and `build_parts`)")
    self.updates_per_step = max(t.updates_per_step for t in self.tenants.values())
    self.optimizers: dict[str, Any] = {}

  def build_model(self, run: loop.Run):
    names = list(self.tenants)
    first = self.tenants[names[0]]
    # The first tenant builds the base (its config differs from the others' only outside
    # `SHARED_KEYS`); the others take their task on the same tokenizer.
    model = first.build_model(dataclasses.replace(run, config=self.configs[names[0]]))
    for name in names[1:]:
      tenant = self.tenants[name]
      tenant.build_parts(run_setup.build_task(self.configs[name], first.tokenizer),
                         first.tokenizer)
      tenant.model = model
    return model

  def create_state(self, run: loop.Run, model) -> TrainState:
    """Each tenant's adapters (fresh draws from its own seed, as a single-LoRA run of its config
    draws them) and optimizer state, stacked (`stack_states`)."""
    lora = self.config.lora
    rank = int(lora.rank)
    states = {}
    for name, config in self.configs.items():
      tenant = without_lora(model)  # the base arrays, shared; a graph of its own
      add_lora(tenant, rank=rank, alpha=lora.alpha, targets=tuple(lora.targets),
               rngs=nnx.Rngs(params=jax.random.fold_in(jax.random.key(config.seed), rank)))
      total = config.steps * self.tenants[name].updates_per_step
      method = self.tenants[name]
      optimizer = (method.optimizer(run, total) if hasattr(method, "optimizer")
                   else run_setup.build_optimizer(config, total))
      self.optimizers[name] = optimizer
      states[name] = create_train_state(tenant, optimizer, jax.random.key(config.seed),
                                        mesh=run.train_mesh, rules=run.train_rules,
                                        trainable=LoraParam)
    return stack_states(states)

  def _tenant_run(self, run: loop.Run, name: str) -> loop.Run:
    return dataclasses.replace(run, config=self.configs[name],
                               workdir=run.workdir / TENANTS_DIR / name,
                               optimizer=self.optimizers[name])

  def start(self, run: loop.Run, state) -> None:
    self.run = run
    self.tenant_runs = {name: self._tenant_run(run, name) for name in self.tenants}
    for name, tenant in self.tenants.items():
      tenant.start(self.tenant_runs[name], tenant_state(state, name))

  def step(self, state, step: int):
    states, record = {}, {}
    streak = 0.0
    for name, tenant in self.tenants.items():
      states[name], own = tenant.step(tenant_state(state, name), step)
      streak = max(streak, float(own.get("train/nonfinite_streak", 0)))
      record.update({tenant_key(k, name): v for k, v in own.items()})
    record["train/nonfinite_streak"] = streak
    return stack_states(states), record

  def evaluate(self, state, step: int) -> dict[str, float]:
    record = {}
    for name, tenant in self.tenants.items():
      own = tenant.evaluate(tenant_state(state, name), step)
      record.update({tenant_key(k, name): v for k, v in own.items()})
    return record

  def state_dict(self) -> dict[str, Any]:
    return {name: tenant.state_dict() for name, tenant in self.tenants.items()}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    for name, tenant in self.tenants.items():
      tenant.load_state_dict(state[name])

  def _gather(self, hook: str) -> dict[str, Any]:
    return {name: getattr(t, hook)() for name, t in self.tenants.items() if hasattr(t, hook)}

  def array_state(self) -> dict[str, Any]:
    return self._gather("array_state")

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    for name, tenant in self.tenants.items():
      if hasattr(tenant, "load_array_state"):
        tenant.load_array_state(arrays[name])

  def sharded_state(self) -> dict[str, Any]:
    return self._gather("sharded_state")

  def load_sharded_state(self, tree: Mapping[str, Any]) -> None:
    for name, tenant in self.tenants.items():
      if hasattr(tenant, "load_sharded_state"):
        tenant.load_sharded_state(tree[name])

  def close(self) -> None:
    for tenant in self.tenants.values():
      if hasattr(tenant, "close"):
        tenant.close()

  def progress(self, record) -> dict[str, float]:
    return {name: record[key] for name in self.tenants
            if (key := tenant_key("train/reward_correct", name)) in record}

  def summary(self, records) -> str:
    lines = [f"{name}: {line}" for name, tenant in self.tenants.items()
             if (line := tenant.summary(tenant_records(records, name)))]
    return "; ".join(lines)

