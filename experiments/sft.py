r"""Teacher-forced SFT on a task's demonstrations (the warm start small models need before RL).

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith

Killed and restarted with the same command, the run resumes from its last
checkpoint in `--workdir` (parameters, optimizer, step and data position).
Devices come from `config.mesh`, as in experiments/grpo.py (the evaluation
sampler plays the sampler's part).
"""

import jax
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import make_placement, maybe_initialize_distributed, put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.sampling import Sampler
from jaxrl_post.tasks import data as task_data
from jaxrl_post.training import rl
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter, read_metrics
from jaxrl_post.training.preemption import PreemptionGuard
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value

  # ---- Processes and devices: the trainer's mesh, and the evaluation sampler's ----
  # As in experiments/grpo.py, so one config's mesh block means the same in both.
  maybe_initialize_distributed()
  placement = make_placement(config.mesh)
  train_mesh, train_rules = placement.train_mesh, placement.train_rules
  logging.info("trainer mesh %s, sampler mesh %s", dict(train_mesh.shape),
               dict(placement.sample_mesh.shape))

  # ---- Task, tokenizer, model (all validated before anything compiles) ----
  task, tokenizer, start, model = run_setup.build_run(config, workdir, train_mesh, train_rules)
  logging.info("start: %s; model %s (%.2fM parameters)", start.kind, config.model,
               model.config.num_params() / 1e6)

  # ---- Data ----
  source = task_data.TaskSource(task, "train", config.num_train_examples)
  loader = task_data.ShardedLoader(source, global_batch_size=config.batch_size,
                                   num_shards=config.data_shards, seed=config.seed)
  eval_records = [task.make_example("test", i) for i in range(config.eval_examples)]

  # ---- Train state, update step, restore ----
  optimizer = run_setup.build_optimizer(config, config.steps)
  state = create_train_state(model, optimizer, jax.random.key(config.seed), mesh=train_mesh,
                             rules=train_rules)
  graphdef = nnx.split(model)[0]
  step_fn = make_train_step(graphdef, rl.sft_loss, optimizer,
                            num_micro_batches=config.num_micro_batches, mesh=train_mesh,
                            rules=train_rules, shared=("num_tokens", "num_sequences"))
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  state, extra = run_setup.restore(start, checkpointer, state)
  data_iter = iter(loader)
  if "data" in extra:
    data_iter.set_state(extra["data"])
  first_step = int(state.step) if start.kind in ("workdir", "resume") else 0
  writer = MetricWriter(workdir, resume_step=first_step if start.kind == "workdir" else None)
  writer.write_config(config)
  sampler = Sampler(model, tokenizer, max_prompt_len=config.prompt_len,
                    mesh=placement.sample_mesh, rules=placement.sample_rules)

  def run_eval(step):
    # Decoding wants the sampler's layout (no per-token FSDP all-gathers).
    params, _ = reshard_state(state.params, placement.sample_mesh, placement.sample_rules)
    metrics = rl.evaluate(sampler, params, task, eval_records,
                          max_new_tokens=config.eval_max_new_tokens,
                          k=config.eval_pass_k).metrics
    writer.write(step, {f"eval/{k}": v for k, v in metrics.items()})
    logging.info("step %d eval: %s", step, metrics)
    return metrics

  # ---- Train loop ----
  bar = tqdm.tqdm(range(first_step + 1, config.steps + 1), initial=first_step,
                  total=config.steps, desc="sft", dynamic_ncols=True)
  with PreemptionGuard() as guard, multihost.peer_failures_are_fatal("SFT"):
    for step in bar:
      records = next(data_iter)
      # This process's shard, then the global batch on every process (as in grpo.py).
      records = multihost.allgather_records(
        [{k: records[k][i] for k in ("prompt", "demonstration")}
         for i in range(len(records["prompt"]))])
      batch = rl.encode_pairs(tokenizer, [r["prompt"] for r in records],
                              [r["demonstration"] for r in records],
                              prompt_len=config.prompt_len, completion_len=config.completion_len)
      batch = put_batch(rl.with_normalizers(batch), train_mesh, train_rules)
      state, metrics = step_fn(state, batch)
      if step % config.log_every == 0 or step == config.steps:
        metrics = run_setup.host_metrics(metrics)
        if metrics["nonfinite_streak"] >= config.max_nonfinite_streak:
          raise RuntimeError(f"{int(metrics['nonfinite_streak'])} updates in a row had a "
                             f"non-finite loss or gradient (step {step}); stopping")
        writer.write(step, {f"train/{k}": v for k, v in metrics.items()})
        bar.set_postfix(nll=f"{metrics['nll']:.3f}")
      if step % config.eval_every == 0 or step == config.steps:
        run_eval(step)
      if step % config.checkpoint_every == 0 or step == config.steps or guard.requested:
        checkpointer.save(step, state, extra={"data": data_iter.get_state()})
      if guard.requested:
        guard.report_stop(step)
        break
  checkpointer.close()
  writer.close()
  print(f"SFT done: checkpoint in {run_setup.checkpoint_dir(workdir)}, "
        f"final eval accuracy {run_eval_cached(workdir):.3f}")


def run_eval_cached(workdir) -> float:
  evals = [r for r in read_metrics(workdir) if "eval/accuracy" in r]
  return evals[-1]["eval/accuracy"] if evals else float(np.nan)


if __name__ == "__main__":
  app.run(main)
