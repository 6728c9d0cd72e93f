"""The one training loop: every method's run, from start-up to the final summary.

    from jaxrl_post.methods.grpo import GRPO
    loop.train(config, workdir, GRPO(config))

`train` owns everything that is the same for every method: joining the other processes
(`jax.distributed`), the trainer's and the sampler's meshes, the model's parameters born
sharded, the optimizer and the train state, the resume policy, the metric writer, the
evaluation / logging / checkpoint cadence, the progress bar, preemption (SIGTERM / SIGINT to any
process: every process saves the same step and stops), a dead peer process (a clear exit), too
many non-finite updates in a row (an error), profiler traces of chosen steps, and the summary
printed at the end. A method brings only what is its own: a
`Method` (below) — how to build its model, what one step does, how to evaluate, which state of
its own must survive a restart.

Order at start-up, and why:

  1. The CPU layout (`config.mesh.cpu_devices`, before JAX's CPU backend starts),
     `jax.distributed`, then the meshes (`config.mesh`): a mesh that does not fit the devices
     fails before anything is built, naming the `config.mesh.*` key.
  2. `method.build_model(run)`: validates the method's config and builds the policy on the
     trainer's mesh. With `config.lora.rank` > 0 (methods with `supports_lora = True`), low-rank
     adapters are attached to it (`models.lora.add_lora`): the train state then holds the
     adapters alone (and their optimizer state; checkpoints too), and the base parameters are
     `run.frozen`, restored from an `init_from` run directory's full parameters when the run
     starts from one, and rebuilt the same way when it resumes.
  3. The optimizer (`config.optimizer`, or the method's optional `optimizer` hook, decayed over
     `steps × method.updates_per_step` updates) and the train state, born sharded.
  4. The run's *starting point* is restored (`init_from` / `resume`), then
     `method.start(run, state)` sees the starting policy — a frozen reference or a teacher
     copied here is the same whether or not the run was restarted — and then this workdir's
     own checkpoint, if any, is applied on top, with the method's saved state
     (`method.load_state_dict`).
  5. Evaluation at step 0 (unless `config.eval_at_start` is False or the run resumed), then
     steps `first + 1 … config.steps`, each `state, record = method.step(state, step)`.

Checkpoints hold the train state and, as JSON, `{"step": s, "method": method.state_dict()}`
(data iterator positions, counters, reference numbers). Metrics go to `workdir/metrics.jsonl`
and the writers `config.metric_writers` names (TensorBoard; W&B, CLU); a resumed run rewrites
the history after its checkpoint, so the file reads as if the run had never stopped.

The workdir is an `etils.epath` path: local, or `gs://bucket/run` on a pod (checkpoints through
orbax, metrics through a local staging copy, see `training.metrics`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
import tqdm
from absl import app, flags, logging
from etils import epath
from flax import nnx
from ml_collections import config_flags

from jaxrl_post.models.lora import LoraParam, add_lora, check_lora_options
from jaxrl_post.parallel import host, multihost
from jaxrl_post.parallel.mesh import Placement, make_placement, maybe_initialize_distributed
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer, StartPoint, as_path
from jaxrl_post.training.metrics import MetricWriter, metric_writer_names, read_metrics
from jaxrl_post.training.preemption import PreemptionGuard
from jaxrl_post.training.profiling import StepProfiler, parse_profile_steps
from jaxrl_post.training.train_state import TrainState, create_train_state


@dataclasses.dataclass
class Run:
  """What the loop has built, handed to the method's hooks.

  Attributes:
    config: the run's (locked) config.
    workdir: where checkpoints, metrics and the method's files go (an `epath.Path`: local and
      absolute, or a URI such as `gs://bucket/run`; build paths with `/`, not `os.path`).
    placement: the trainer's and the sampler's meshes and rule tables.
    start: where the run starts (`training.checkpoint.StartPoint`).
    writer: the metric writer (set before the first evaluation).
    optimizer: the optax transformation of the train state (set before `method.start`).
    graphdef: the policy's `nnx` graph definition (`nnx.merge(graphdef, state.params)` is the
      model; set before `method.start`). In a LoRA run, the graph of
      `nnx.split(model, LoraParam, ...)`: the model is `nnx.merge(graphdef, state.params,
      frozen)`.
    frozen: a LoRA run's base parameters (`nnx.State`, on the trainer's mesh), which the train
      state does not hold; None otherwise.
  """

  config: Any
  workdir: epath.Path
  placement: Placement
  start: StartPoint
  writer: MetricWriter | None = None
  optimizer: Any = None
  graphdef: Any = None
  frozen: Any = None

  @property
  def train_mesh(self):
    return self.placement.train_mesh

  @property
  def train_rules(self):
    return self.placement.train_rules


class Method(Protocol):
  """What a method brings to `train` (a plain object; nothing to inherit).

  Required:
    name: a short name (progress bar, logs).
    updates_per_step: optimizer updates per step (the learning-rate schedule's horizon is
      `config.steps × updates_per_step`).
    build_model(run) -> nnx.Module: validates the method's config (raising errors that name the
      key) and builds the policy, on `run.train_mesh` where the method supports it.
    start(run, state) -> None: everything else the method needs (samplers, jitted update
      steps, teachers, a frozen reference, environments, data). `state` is the *starting*
      policy (before this workdir's checkpoint is applied).
    step(state, step) -> (state, record): one training step; `record` maps metric names
      (`train/…`, `rollout/…`, `time/…`) to scalars and must hold `train/nonfinite_streak`
      when the step updated the parameters.
    evaluate(state, step) -> record: held-out metrics (`eval/…`), written by the loop. The
      call at step 0 happens once per run (not again after a restart), so one-off reference
      numbers taken there must go into `state_dict`.
    state_dict() -> dict: the method's own state to checkpoint (JSON: data positions,
      counters, reference totals).
    load_state_dict(d) -> None: restores it after a restart.
    summary(records) -> str: one line for the end of the run from the metrics history.

  Optional:
    array_state() -> pytree of numpy arrays: state too large or too exact for JSON (replay
      buffers, calibrators, bandit statistics, sampling priors), saved with each checkpoint
      (the same on every process); fixed shapes, set up by `start`.
    load_array_state(tree) -> None: restores it after a restart (called after
      `load_state_dict`, with `array_state()`'s structure).
    sharded_state() -> pytree of global jax arrays: device state of the method's own (a
      second model's `TrainState`, e.g. PPO's critic), checkpointed sharded like the policy's
      state, each process writing and reading its shards only; set up by `start`.
    load_sharded_state(tree) -> None: restores it after a restart, in `sharded_state()`'s
      structure and shardings (called after `load_array_state`).
    optimizer(run, total_updates) -> optax.GradientTransformation: the method's own optimizer
      of the train state (per-parameter-group learning rates, frozen groups:
      `training.phases`), decayed over `total_updates`; without it the loop builds
      `config.optimizer` (`training.setup.build_optimizer`). Called after `build_model`.
    create_state(run, model) -> state: the method's own train state (a pytree the loop passes
      to its hooks and checkpoints as it is) instead of `create_train_state` of `model`'s
      trainable parameters with `run.optimizer`; called after `build_model` (and after a LoRA
      run's adapters are attached), with `run.placement` and `run.optimizer` set. Several
      adapters on one base (`methods.multi_lora`) keep one `TrainState` per adapter here.
    progress(record) -> dict[str, float]: values for the progress bar.
    done(step) -> bool: stop after this step although `config.steps` is not reached (a token
      budget spent, say); the loop evaluates and checkpoints as at the last step.
    close() -> None: releases what `start` started (a producer thread); called once the steps
      end, normally or by an exception.
  """

  name: str
  updates_per_step: int

  def build_model(self, run: Run) -> nnx.Module: ...

  def start(self, run: Run, state: TrainState) -> None: ...

  def step(self, state: TrainState, step: int) -> tuple[TrainState, Mapping[str, Any]]: ...

  def evaluate(self, state: TrainState, step: int) -> Mapping[str, Any]: ...

  def state_dict(self) -> dict[str, Any]: ...

  def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str: ...


def check_finite(record: Mapping[str, Any], step: int, limit: int) -> None:
  """Raises when `limit` or more updates in a row had a non-finite loss or gradient."""
  streak = record.get("train/nonfinite_streak", 0)
  if streak >= limit:
    raise RuntimeError(f"{int(streak)} updates in a row had a non-finite loss or gradient "
                       f"(step {step}); stopping (config.max_nonfinite_streak={limit})")


def lora_rank(config, method: Method) -> int:
  """`config.lora.rank` (0 when the config has no `lora` block), validated with its
  `alpha` and `targets`.

  Raises:
    ValueError: naming `config.lora.*` (`models.lora.check_lora_options`), or rank > 0 for a
      method without `supports_lora`.
  """
  lora = config.get("lora")
  if not lora or not lora.get("rank", 0):
    return 0
  check_lora_options(lora.rank, lora.get("alpha", 16.0), tuple(lora.get("targets", ())))
  if not getattr(method, "supports_lora", False):
    raise ValueError(f"config.lora.rank={lora.rank}: method {method.name!r} does not support "
                     "LoRA (no `supports_lora`); set config.lora.rank=0 for full fine-tuning")
  return int(lora.rank)


def _restore_frozen_base(start: StartPoint, frozen):
  """A LoRA run's base parameters from an `init_from` run directory's full parameters.

  Raises:
    ValueError: naming `config.init_from` when the checkpoint lacks them (e.g. a LoRA run's,
      which holds adapters only; orbax's partial restore leaves such leaves abstract).
  """
  problem = None
  try:
    restored = Checkpointer(start.path).restore_params(start.step, frozen)
  except (ValueError, KeyError, FileNotFoundError) as e:
    problem = str(e)
  else:
    missing = [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_flatten_with_path(
      restored)[0] if isinstance(x, jax.ShapeDtypeStruct)]
    if not missing:
      return restored
    problem = f"missing {', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}"
  raise ValueError(
    f"config.init_from={str(start.path)!r}: a LoRA run takes its frozen base from the full "
    f"parameters of that checkpoint, which it lacks ({problem}); a LoRA run's own checkpoint "
    "holds adapters only: export it merged (scripts/export_hf.py) and init_from the export")


@contextlib.contextmanager
def _closing(method: Method):
  """Calls the method's optional `close()` (background threads, pools) however the steps end."""
  try:
    yield
  finally:
    if hasattr(method, "close"):
      method.close()


def _due(step: int, every: int, last: bool) -> bool:
  return last or (every > 0 and step % every == 0)


def train(config, workdir: str | os.PathLike, method: Method) -> TrainState:
  """Runs `method` for `config.steps` steps in `workdir`, resuming from its last checkpoint.

  Config keys read here (besides the method's): `mesh` (`parallel.mesh.mesh_config()`),
  `seed`, `steps`, `optimizer`, `init_from` / `resume`, `log_every`, `eval_every`,
  `checkpoint_every`, `keep_checkpoints`, `max_nonfinite_streak`, and optionally
  `eval_at_start` (default True), `metric_writers` and `wandb_project` (`training.metrics`),
  `profile_steps` and `profile_all_processes` (`training.profiling`).

  Returns:
    The final train state.
  """
  workdir = as_path(workdir)
  # Options that fail in seconds, before anything is built or compiled.
  metric_writer_names(config.get("metric_writers", "jsonl,tensorboard"))
  parse_profile_steps(config.get("profile_steps", ""))
  # ---- Processes and devices ----
  # The CPU layout first: it can only be chosen before JAX's CPU backend starts.
  host.configure_cpu_devices(int(config.mesh.get("cpu_devices", 0)))
  maybe_initialize_distributed()  # before anything else asks JAX about processes or devices
  profiler = StepProfiler.from_config(config, workdir)
  placement = make_placement(config.mesh)
  logging.info("%s: trainer mesh %s, sampler mesh %s (%s)", method.name,
               dict(placement.train_mesh.shape), dict(placement.sample_mesh.shape),
               "colocated" if placement.colocated else "disaggregated")
  run = Run(config=config, workdir=workdir, placement=placement,
            start=run_setup.start_point(config, workdir))

  # ---- Model, optimizer, train state (validated before anything compiles) ----
  rank = lora_rank(config, method)
  model = method.build_model(run)
  if rank:
    add_lora(model, rank=rank, alpha=config.lora.alpha, targets=tuple(config.lora.targets),
             rngs=nnx.Rngs(params=jax.random.fold_in(jax.random.key(config.seed), rank)))
  logging.info("%s: start %s; model %.2fM parameters, %.2fM trained", method.name,
               run.start.kind, _millions(nnx.state(model, nnx.Param)),
               _millions(nnx.state(model, LoraParam if rank else nnx.Param)))
  total_updates = config.steps * method.updates_per_step
  run.optimizer = (method.optimizer(run, total_updates) if hasattr(method, "optimizer")
                   else run_setup.build_optimizer(config, total_updates))
  if hasattr(method, "create_state"):
    state = method.create_state(run, model)
  else:
    state = create_train_state(model, run.optimizer, jax.random.key(config.seed),
                               mesh=placement.train_mesh, rules=placement.train_rules,
                               trainable=LoraParam if rank else nnx.Param)
  if rank:
    run.graphdef, _, run.frozen = nnx.split(model, LoraParam, ...)
  else:
    run.graphdef = nnx.split(model)[0]

  # ---- The starting point, the method's set-up, then this workdir's checkpoint ----
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  initial = run_setup.start_point(config, workdir, ignore_workdir=True)
  if rank and initial.kind == "init_from_checkpoint":
    # The checkpoint's full parameters are the frozen base's; the adapters start fresh.
    run.frozen = _restore_frozen_base(initial, run.frozen)
    nnx.update(model, run.frozen)  # the model (samplers' graphs) holds the same arrays
    extra = {}
  else:
    state, extra = run_setup.restore(initial, checkpointer, state)
  method.start(run, state)
  if run.start.kind == "workdir":
    state, extra = run_setup.restore(run.start, checkpointer, state)
    run_setup.check_resume_identity(config, workdir, extra.get("run"))
  resumed = run.start.kind in ("workdir", "resume")
  # Checkpoints written before the one loop kept the step as "rl_step" / "phase_step" and
  # the method's state at the top level; they resume too.
  first_step = int(extra.get("step", extra.get("rl_step", extra.get("phase_step", 0))))
  first_step = first_step if resumed else 0
  if resumed:
    method.load_state_dict(extra.get("method", extra))
    if hasattr(method, "array_state"):
      arrays = run_setup.restore_method_arrays(run.start, checkpointer, method.array_state())
      if arrays is not None:
        method.load_array_state(arrays)
    if hasattr(method, "sharded_state"):
      sharded = run_setup.restore_method_sharded(run.start, checkpointer,
                                                 method.sharded_state())
      if sharded is not None:
        method.load_sharded_state(sharded)
  run.writer = writer = MetricWriter.from_config(config, workdir,
                                                 resume_step=first_step if resumed else None)
  writer.write_config(config)

  def evaluate(step: int) -> None:
    record = method.evaluate(state, step)
    if not record:  # evaluation turned off (e.g. eval_examples = 0)
      return
    writer.write(step, record)
    logging.info("%s step %d eval: %s", method.name, step, dict(record))

  def save(step: int) -> None:
    writer.flush()  # a remote workdir then holds the metrics of every step up to this one
    # Copied: an asynchronous save reads them after the method may have changed them in place.
    arrays = (jax.tree.map(np.array, method.array_state()) if hasattr(method, "array_state")
              else None)
    checkpointer.save(step, state, extra={"step": step, "method": method.state_dict(),
                                          "run": run_setup.run_identity(config)},
                      arrays=arrays,
                      sharded=method.sharded_state() if hasattr(method, "sharded_state")
                      else None)

  # ---- Steps ----
  limit = config.max_nonfinite_streak
  done = getattr(method, "done", lambda step: False)
  progress = getattr(method, "progress", lambda record: {})
  with multihost.peer_failures_are_fatal(f"{method.name} training"), _closing(method):
    if first_step == 0 and config.get("eval_at_start", True):
      evaluate(0)
    # A run whose method was done before the restart (its budget spent) has nothing left.
    last_step = first_step if first_step and done(first_step) else config.steps
    bar = tqdm.tqdm(range(first_step + 1, last_step + 1), initial=first_step,
                    total=config.steps, desc=method.name, dynamic_ncols=True,
                    disable=jax.process_index() != 0)
    with PreemptionGuard() as guard:
      for step in bar:
        profiler.before_step(step)
        state, record = method.step(state, step)
        profiler.after_step(step, (state, record))
        check_finite(record, step, limit)
        last = step == config.steps or done(step)
        if _due(step, config.log_every, last):
          writer.write(step, record)
        bar.set_postfix({k: f"{v:.4g}" for k, v in progress(record).items()})
        if _due(step, config.eval_every, last):
          evaluate(step)
        # Every process, every step: the collective save needs the same answer everywhere.
        stop = guard.stop_agreed(step)
        if _due(step, config.checkpoint_every, last) or stop:
          save(step)
        if stop:
          guard.report_stop(step)
          break
        if last:
          break
  profiler.close()
  checkpointer.close()
  writer.close()
  if jax.process_index() == 0:
    line = method.summary(read_metrics(workdir))
    if line:
      print(line)
  return state


def _millions(state) -> float:
  return sum(x.size for x in jax.tree.leaves(state)) / 1e6


def eval_summary(records: Sequence[Mapping[str, Any]], key: str, label: str) -> str:
  """`label first → last` of an eval metric over the run's history ('' when never evaluated)."""
  evals = [r for r in records if key in r]
  if not evals:
    return ""
  first, last = evals[0], evals[-1]
  # float(): the metrics file writes NaN / inf as strings ("nan").
  return (f"{label}: {float(first[key]):.3f} at step {first['step']} → "
          f"{float(last[key]):.3f} at step {last['step']}")


def main(make_method: Callable[[Any], Method]) -> None:
  """A whole binary: `--config` (an ml_collections config file) and `--workdir`, then `train`.

      if __name__ == "__main__":
        loop.main(GRPO)   # experiments/grpo.py

  The flags are defined here, when the binary runs, not when this module is imported, so
  tests and scripts can import the loop next to other flag definitions.
  """
  config = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
  workdir = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
  flags.mark_flags_as_required(["config", "workdir"])

  def run(argv):
    del argv
    # Before anything compiles; a binary's choice (a process-wide setting), not `train`'s.
    run_setup.enable_compilation_cache(config.value.get("compilation_cache_dir", ""))
    train(config.value, workdir.value, make_method(config.value))

  app.run(run)
