r"""Evaluates a policy on a verifiable task: greedy accuracy, mean@n and unbiased pass@k ± SE.

  python experiments/evaluate.py --run_dir=/tmp/grpo_arith                  # latest checkpoint
  python experiments/evaluate.py --run_dir=/tmp/grpo_arith --step=200 --n=16 --k=1,4,16 \
      --num_examples=500 --output=/tmp/grpo_arith_step200.json
  python experiments/evaluate.py --init_from=hf:Qwen/Qwen3-0.6B --task=gsm8k --n=8 \
      --output=/tmp/qwen3_gsm8k.json

The policy is a run's checkpoint (`--run_dir`, `training.run_dir.load_run`: the model as the
run built it, the parameters of `--step` or the latest one) or a Hugging Face checkpoint
(`--init_from`: a directory or an `hf:<org>/<name>` spec, with `--tokenizer`, default the same
place). The task, its knobs and every generation setting default to the run's, and the numbers
come from `training.evaluation.evaluate`, the function the run's own in-run evaluation calls:
with the run's settings, `--num_examples=config.eval_examples` and the default seed (the
checkpoint step, as in the run) this prints what the run logged at that step.

Reported, each with its standard error over problems (std / √P): greedy accuracy; mean@n, the
mean fraction of n samples at `--temperature` that are correct; pass@k for each `--k` ≤ n with
the unbiased estimator of arXiv 2107.03374 (`training.evaluation.pass_at_k`). The table goes to
stdout; `--output` gets the metrics, the settings and each problem's outcomes as JSON (default
`<run_dir>/evaluations/step_<step>_<task>_<split>.json` for a run, none otherwise).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
from absl import app, flags, logging

from jaxrl_post import script_flags
from jaxrl_post.methods.grpo import fitting_indices
from jaxrl_post.parallel.mesh import make_placement, mesh_config
from jaxrl_post.sampling import Sampler
from jaxrl_post.training import base_configs
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.evaluation import evaluate
from jaxrl_post.training.run_dir import load_run, read_config

FLAGS = flags.FlagValues()  # This binary's own (see `script_flags`): tests import it.
_RUN_DIR = flags.DEFINE_string("run_dir", "", "A run's --workdir (config.json + checkpoints/).",
                               flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "The run's checkpoint step (default: the latest).",
                             flag_values=FLAGS)
_INIT_FROM = flags.DEFINE_string(
  "init_from", "", "Instead of --run_dir: a Hugging Face checkpoint directory or 'hf:org/name'.",
  flag_values=FLAGS)
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "With --init_from: the tokenizer ('char', a "
                                 "directory or 'hf:org/name'; default: --init_from).",
                                 flag_values=FLAGS)
_TASK = flags.DEFINE_string("task", "", "A registered task (default: the run's).",
                            flag_values=FLAGS)
_TASK_KNOBS = flags.DEFINE_string(
  "task_knobs", "", "The task's knobs as JSON, e.g. '{\"max_digits\": 3}' (default: the run's, "
  "when --task is the run's; these keys override them).", flag_values=FLAGS)
_CHAT_TEMPLATE = flags.DEFINE_bool(
  "chat_template", None, "Render prompts with the tokenizer's chat template (default: as the "
  "run did, else no).", flag_values=FLAGS)
_SYSTEM_PROMPT = flags.DEFINE_string("system_prompt", None, "With the chat template (default: "
                                     "the run's config.system_prompt).", flag_values=FLAGS)
_CHAT_TEMPLATE_KWARGS = flags.DEFINE_string(
  "chat_template_kwargs", "", "The template's switches as JSON, e.g. '{\"enable_thinking\": "
  "true}' (default: the run's, else the configs' default, thinking off).", flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", "test", "The task split.", flag_values=FLAGS)
_NUM_EXAMPLES = flags.DEFINE_integer(
  "num_examples", 0, "Problems 0 … N−1 of the split (0: the run's config.eval_examples, else "
  "128; at most the split's size).", flag_values=FLAGS)
_N = flags.DEFINE_integer("n", -1, "Sampled completions per problem (0: greedy only; default: "
                          "the run's in-run n when it sampled, else 4).", flag_values=FLAGS)
_K = flags.DEFINE_list("k", [], "The k of pass@k, each ≤ n (default: 1, 2, 4, … ≤ n and n).",
                       flag_values=FLAGS)
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature (default: the "
                                  "run's config.temperature, else 1).", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 0, "Generation budget (0: the run's eval_max_new_tokens or max_new_tokens, "
  "else 512).", flag_values=FLAGS)
_MAX_PROMPT_LEN = flags.DEFINE_integer("max_prompt_len", 0, "Longest prompt in tokens (0: the "
                                       "run's config.prompt_len, else 512).", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", None, "Sampling seed (default: the checkpoint step, the "
                             "in-run evaluation's; 0 for --init_from).", flag_values=FLAGS)
_ROWS_PER_CALL = flags.DEFINE_integer(
  "rows_per_call", None, "At most this many completions per sampler call, so a large evaluation's "
  "KV cache fits (default: the run's config.eval_rows_per_call; 0: all in one call).",
  flag_values=FLAGS)
_TIMEOUT_S = flags.DEFINE_float("timeout_s", None, "Per verifier call (default: the run's "
                                "config.reward_timeout_s, else 10).", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", "", "JSON report path.", flag_values=FLAGS)


def default_pass_ks(n: int) -> list[int]:
  """1, 2, 4, … below n, and n itself ([] for n = 0)."""
  ks = [2 ** i for i in range(max(n, 1).bit_length()) if 2 ** i < n]
  return ks + [n] if n else []


def _policy():
  """(config, model, tokenizer, step, placement) of --run_dir or --init_from.

  A Hugging Face checkpoint gets a config of its own with the keys `setup.build_model` /
  `build_tokenizer` read (float32 parameters and activations), and step None.
  """
  if bool(_RUN_DIR.value) == bool(_INIT_FROM.value):
    raise app.UsageError("pass exactly one of --run_dir (a run's workdir) and --init_from (a "
                         "Hugging Face directory or 'hf:org/name')")
  if _RUN_DIR.value:
    config = read_config(_RUN_DIR.value)
    placement = _placement(config.get("mesh"))
    run = load_run(_RUN_DIR.value, step=_STEP.value, mesh=placement.sample_mesh,
                   rules=placement.sample_rules)
    return run.config, run.model, run.tokenizer, run.step, placement
  if _STEP.value is not None:
    raise app.UsageError("--step reads a run's checkpoint: use it with --run_dir")
  config = ml_collections.ConfigDict(dict(
    init_from=_INIT_FROM.value, tokenizer=_TOKENIZER.value or _INIT_FROM.value, seed=0,
    model="", model_overrides={}))
  base_configs.precision_config(config)
  placement = _placement(None)
  tokenizer = run_setup.build_tokenizer(config)
  start = run_setup.start_point(config, "/nonexistent", ignore_workdir=True)
  if start.kind != "init_from_hf":
    raise app.UsageError(f"--init_from={_INIT_FROM.value!r} is not a Hugging Face checkpoint "
                         "(config.json + safetensors); for a run's workdir use --run_dir")
  model = run_setup.build_model(config, tokenizer, start, placement.sample_mesh,
                                placement.sample_rules)
  return config, model, tokenizer, None, placement


def _placement(mesh):
  """The run's sampler mesh on this machine's devices, or every device on `fsdp`."""
  if mesh is not None:
    try:
      return make_placement(mesh)
    except ValueError as e:
      logging.warning("the run's config.mesh does not fit these devices (%s); evaluating on "
                      "all %d devices, fsdp", e, jax.device_count())
  return make_placement(mesh_config())


def _task(config, tokenizer):
  """The task: --task / --task_knobs over the run's, its prompts rendered with the tokenizer's
  chat template when the run did (or `--chat_template`), as `setup.build_task` does in-run."""
  try:
    knobs = json.loads(_TASK_KNOBS.value) if _TASK_KNOBS.value else {}
    template_kwargs = (json.loads(_CHAT_TEMPLATE_KWARGS.value) if _CHAT_TEMPLATE_KWARGS.value
                       else config.get("chat_template_kwargs")
                       or base_configs.grpo_base().chat_template_kwargs.to_dict())
  except json.JSONDecodeError as e:
    raise app.UsageError(f"--task_knobs / --chat_template_kwargs is not JSON: {e}") from None
  name = _TASK.value or config.get("task", "")
  if not name:
    raise app.UsageError("--task: a Hugging Face checkpoint has no task; name one")
  if name == config.get("task"):
    knobs = {**dict(config.get("task_knobs") or {}), **knobs}
  chat = _CHAT_TEMPLATE.value
  task_config = ml_collections.ConfigDict(dict(
    task=name, task_knobs=knobs, tokenizer=str(config.get("tokenizer")),
    init_from=config.get("init_from", ""),
    chat_template=bool(config.get("chat_template", False) if chat is None else chat),
    system_prompt=(config.get("system_prompt", "") if _SYSTEM_PROMPT.value is None
                   else _SYSTEM_PROMPT.value),
    chat_template_kwargs=dict(template_kwargs)))
  try:
    return name, knobs, task_config, run_setup.build_task(task_config, tokenizer)
  except ValueError as e:
    raise app.UsageError(f"--task={name!r} / --task_knobs / --chat_template: {e}") from None


def _records(task, config, tokenizer, max_prompt_len: int) -> list[dict[str, Any]]:
  """The first `--num_examples` problems of `--split` whose prompts fit `max_prompt_len`, chosen
  as the in-run evaluation chooses them (`methods.grpo.fitting_indices`, with the run's
  `long_prompts` policy; "error" for a Hugging Face checkpoint)."""
  split = _SPLIT.value
  splits = task.splits
  if splits is not None and split not in splits:
    raise app.UsageError(f"--split={split!r}: the task's splits are {', '.join(splits)}")
  count = _NUM_EXAMPLES.value or int(config.get("eval_examples", 128))
  size = task.num_examples(split)
  if size is not None and count > size:
    logging.info("--num_examples=%d > the %d problems of split %r: evaluating all of them",
                 count, size, split)
    count = size
  limits = ml_collections.ConfigDict(dict(prompt_len=max_prompt_len,
                                          long_prompts=config.get("long_prompts", "error")))
  try:
    indices = fitting_indices(limits, task, tokenizer, split, count, "--task")
  except ValueError as e:
    raise app.UsageError(f"{e} (here: --max_prompt_len)") from None
  return [task.make_example(split, i) for i in indices]


def format_table(metrics: dict[str, float], n: int, pass_ks: list[int]) -> str:
  """The metrics as an aligned text table: name, value, ± standard error."""
  rows = [("greedy accuracy", "accuracy")]
  if "format" in metrics:
    rows.append(("greedy format", "format"))
  if n:
    rows.append((f"mean@{n}", "sample_accuracy"))
    rows += [(f"pass@{k}", f"pass_at_{k}") for k in pass_ks]
    if "sample_format" in metrics:
      rows.append(("sampled format", "sample_format"))
  lines = [f"{'metric':<18}{'value':>8}{'± SE':>9}"]
  for label, key in rows:
    se = metrics.get(f"{key}_se")
    lines.append(f"{label:<18}{metrics[key]:>8.4f}" + ("" if se is None else f"{se:>9.4f}"))
  lines.append(f"problems: {int(metrics['num_problems'])}, verifier errors: "
               f"{int(metrics['verifier_errors'])}, time-outs: {int(metrics['verifier_timeouts'])}")
  return "\n".join(lines)


def _json_value(x):
  return None if isinstance(x, float) and not math.isfinite(x) else x


def main(argv: list[str]) -> None:
  """Evaluates and reports (flags only: `argv` is the program name)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  # ---- Policy ----
  config, model, tokenizer, step, placement = _policy()

  # ---- Task and settings (the run's unless a flag says otherwise) ----
  task_name, knobs, task_config, task = _task(config, tokenizer)
  n = _N.value if _N.value >= 0 else int(config.get("eval_samples") or
                                         config.get("eval_pass_k") or 4)
  try:
    pass_ks = [int(k) for k in _K.value] if _K.value else default_pass_ks(n)
  except ValueError:
    raise app.UsageError(f"--k={','.join(_K.value)}: expected integers") from None
  if any(k < 1 or k > n for k in pass_ks):
    raise app.UsageError(f"--k={','.join(map(str, pass_ks))}: pass@k needs 1 <= k <= n "
                         f"(--n={n})")
  temperature = (_TEMPERATURE.value if _TEMPERATURE.value is not None
                 else float(config.get("temperature", 1.0)))
  max_new_tokens = (_MAX_NEW_TOKENS.value or config.get("eval_max_new_tokens")
                    or config.get("max_new_tokens") or 512)
  max_prompt_len = _MAX_PROMPT_LEN.value or int(config.get("prompt_len", 512))
  records = _records(task, config, tokenizer, max_prompt_len)
  seed = _SEED.value if _SEED.value is not None else (step or 0)
  timeout_s = (_TIMEOUT_S.value if _TIMEOUT_S.value is not None
               else float(config.get("reward_timeout_s", 10.0)))
  rows_per_call = (_ROWS_PER_CALL.value if _ROWS_PER_CALL.value is not None
                   else int(config.get("eval_rows_per_call") or 0)) or None
  settings = dict(run_dir=_RUN_DIR.value or None, step=step, init_from=_INIT_FROM.value or None,
                  tokenizer=str(config.get("tokenizer")), task=task_name, task_knobs=knobs,
                  chat_template=task_config.chat_template,
                  system_prompt=task_config.system_prompt,
                  chat_template_kwargs=task_config.chat_template_kwargs.to_dict(),
                  split=_SPLIT.value, num_examples=len(records), n=n, pass_ks=pass_ks,
                  temperature=temperature, max_new_tokens=int(max_new_tokens),
                  max_prompt_len=max_prompt_len, seed=seed, timeout_s=timeout_s,
                  rows_per_call=rows_per_call,
                  devices=jax.device_count())
  logging.info("evaluating: %s", settings)

  # ---- Evaluate ----
  sampler = Sampler(model, tokenizer, max_prompt_len=max_prompt_len,
                    mesh=placement.sample_mesh, rules=placement.sample_rules)
  tic = time.perf_counter()
  evaluation = evaluate(sampler, None, task, records, max_new_tokens=int(max_new_tokens), k=n,
                        temperature=temperature, rng=jax.random.key(seed), timeout_s=timeout_s,
                        pass_ks=pass_ks, rows_per_call=rows_per_call)
  settings["seconds"] = round(time.perf_counter() - tic, 3)

  # ---- Report ----
  print(f"{task_name} ({_SPLIT.value}), "
        f"{'step ' + str(step) + ' of ' + _RUN_DIR.value if step is not None else _INIT_FROM.value}"
        f", n={n}, T={temperature:g}:")
  print(format_table(evaluation.metrics, n, pass_ks))
  output = _OUTPUT.value
  if not output and _RUN_DIR.value:
    output = str(Path(_RUN_DIR.value) / "evaluations" /
                 f"step_{step:08d}_{task_name}_{_SPLIT.value}.json")
  if output:
    problems = [dict(index=int(r["index"]), prompt=r["prompt"], greedy_completion=text,
                     greedy_correct=_json_value(float(g)),
                     sample_correct=[_json_value(float(x)) for x in row])
                for r, text, g, row in zip(records, evaluation.greedy_texts,
                                           evaluation.greedy_correct, evaluation.sample_correct)]
    report = dict(metrics={k: _json_value(v) for k, v in evaluation.metrics.items()},
                  settings=settings, problems=problems)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
