"""Teacher-forced SFT on a task's demonstrations (the warm start small models need before RL).

One step: `batch_size` (prompt, demonstration) records from this process's data shards,
gathered into the global batch, tokenised (prompts left-padded, demonstrations right-padded,
EOS appended) and one update of the token-mean NLL (`losses.nll_loss`) over the
demonstration tokens. Evaluation: held-out greedy accuracy (and pass@k) from the sampler.
With `config.sft_views` some rows are shown with an instruction line or a golden negative to
fix (`methods.sft_views`: the cold start ICE and ReflectRL need).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_post.methods import sft_views
from jaxrl_post.methods.grpo import TaskEvaluator, global_records, task_loader
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.sampling import Sampler
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.objectives import encode_pairs, sft_loss
from jaxrl_post.training.train_state import make_train_step


class SFT:
  """SFT on `config.task`'s demonstrations (configs/sft_*.py); a `training.loop.Method`."""

  name = "sft"
  updates_per_step = 1

  def __init__(self, config):
    if config.get("stop_at_accuracy", 0.0) and config.eval_examples == 0:
      raise ValueError("config.stop_at_accuracy needs held-out evaluation: "
                       "config.eval_examples must be >= 1 (it is 0)")
    self.config = config
    # The latest held-out greedy accuracy, for `config.stop_at_accuracy`.
    self.last_accuracy = float("nan")

  def build_model(self, run: loop.Run):
    self.task, self.tokenizer, _, self.model = run_setup.build_run(
      self.config, str(run.workdir), run.train_mesh, run.train_rules)
    if sft_views.active(self.config):
      sft_views.validate_views(self.config, self.task)
    return self.model

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    self.step_fn = make_train_step(run.graphdef, sft_loss, run.optimizer,
                                   num_micro_batches=config.num_micro_batches,
                                   mesh=run.train_mesh, rules=run.train_rules,
                                   shared=("num_tokens", "num_sequences"))
    self.data_iter = iter(task_loader(config, self.task, config.batch_size))
    sampler = Sampler(self.model, self.tokenizer, max_prompt_len=config.prompt_len,
                      mesh=run.placement.sample_mesh, rules=run.placement.sample_rules)
    self.evaluator = TaskEvaluator(run, self.task, sampler,
                                   max_new_tokens=config.eval_max_new_tokens,
                                   pass_k=config.eval_pass_k)

  def state_dict(self) -> dict[str, Any]:
    return {"data": self.data_iter.get_state(), "last_accuracy": self.last_accuracy}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "data" in state:
      self.data_iter.set_state(state["data"])
    self.last_accuracy = float(state.get("last_accuracy", float("nan")))

  def step(self, state, step: int):
    config, run = self.config, self.run
    views_on = sft_views.active(config)  # views read the whole record (meta, index)
    records = global_records(self.data_iter, None if views_on else ("prompt", "demonstration"))
    prompts = [r["prompt"] for r in records]
    demos = [r["demonstration"] for r in records]
    views = {}
    if views_on:
      prompts, demos, which = sft_views.apply_views(records, self.task, config.sft_views,
                                                    seed=config.seed, step=step)
      views = {f"sft/{name}_frac": float(np.mean(which == i))
               for i, name in enumerate(sft_views.VIEWS)}
    batch = encode_pairs(self.tokenizer, prompts, demos, prompt_len=config.prompt_len,
                         completion_len=config.completion_len)
    state, metrics = self.step_fn(state, put_batch(ppo.with_normalizers(batch), run.train_mesh,
                                                   run.train_rules))
    record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    return state, record | views

  def evaluate(self, state, step: int) -> dict[str, float]:
    record = self.evaluator(state.params, step)
    if record:  # empty when evaluation is off (config.eval_examples = 0)
      self.last_accuracy = float(record["eval/accuracy"])
    return record

  def done(self, step: int) -> bool:
    """With `config.stop_at_accuracy` > 0: stop once an evaluation reached that greedy accuracy.

    An RL stage after SFT needs headroom *and* a policy past SFT's steepest climb; a fixed step
    count lands at a seed-dependent accuracy (docs/results.md, the quickstart), a target
    accuracy does not. The check reads the latest evaluation, so the run stops at the step
    after the one that reached it (and evaluates and checkpoints there).
    """
    del step
    target = self.config.get("stop_at_accuracy", 0.0)
    return bool(target) and self.last_accuracy >= target

  def progress(self, record):
    return {"nll": record["train/nll"]}

  def summary(self, records) -> str:
    line = loop.eval_summary(records, "eval/accuracy", "held-out greedy accuracy")
    return f"SFT done: checkpoint in {run_setup.checkpoint_dir(str(self.run.workdir))}; {line}"
