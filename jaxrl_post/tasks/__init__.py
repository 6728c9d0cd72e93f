"""Verifiable tasks: seeded prompt generators, demonstrations and verifiers.

  task = get_task("arith", max_digits=4, num_operands=3)
  record = task.make_example("train", 0)     # prompt, answer, demonstration, meta, ...
  correct, fmt = task.reward(record, completion)

Registered tasks (`TASKS`): `"arith"` (multi-digit arithmetic with worked steps),
`"countdown"` (reach a target with + - * /), `"format"` (short format-following replies),
`"jsonl"` and `"parquet"` (GSM8K-style question / answer files), `"gsm8k"`, `"math"` and
`"math500"` (the real datasets from the Hub or local files, `math_datasets`), `"mixture"`
(several of these as labelled domains, for multi-teacher distillation), `"pertmind"` (a
synthetic perturbation atlas, PertMind) and `"aerial_nav"` (action programs flown in closed
loop on grid maps with long-tailed scenes, RecoverFly). Modules: `base` (interface,
record format, answer parsing), one module per task, `expressions` (the safe expression
evaluator), `priors` (task-sampling priors over a pool: TrajVal's learnability prior, RAPO's
risk buckets, CANOPY's signal-coverage group sizing) and `data` (tfds builder and grain loader;
import it explicitly, as it loads tensorflow-datasets). Two non-text data modules have their
own APIs and are not registered `Task`s: `dense_scenes` (images of up to 500+ objects with
referring queries, for the dense detector) and `point_clouds` (distorted point clouds with
hidden MOS, for quality rating), and `toy_crystals` (2-D periodic cells with Lennard-Jones
polymorphs and a structure matcher, for CrystalGRPO).
"""

from jaxrl_post.tasks import aerial_nav as aerial_nav  # registers "aerial_nav"
from jaxrl_post.tasks import arithmetic, countdown, files, format_following, math_datasets
from jaxrl_post.tasks import mixture as mixture  # registers "mixture"
from jaxrl_post.tasks import perturbation_atlas as perturbation_atlas  # registers "pertmind"
from jaxrl_post.tasks.arithmetic import ArithmeticTask
from jaxrl_post.tasks.base import (
  FINAL_ANSWER_MARKER,
  RECORD_FIELDS,
  TASKS,
  Reward,
  Task,
  final_answer,
  get_task,
  parse_meta,
)
from jaxrl_post.tasks.countdown import CountdownTask
from jaxrl_post.tasks.files import FileQATask, JsonlTask, ParquetTask
from jaxrl_post.tasks.format_following import FormatFollowingTask
from jaxrl_post.tasks.math_datasets import GSM8KTask, Math500Task, MathTask
from jaxrl_post.tasks.priors import (
  TASK_PRIORS,
  bucket_probs,
  check_group_size,
  combine_with_online,
  endpoint_rewards,
  min_group_size,
  risk_buckets,
  sample_tasks,
  signal_coverage,
  trajval_scores,
  trajval_weights,
  uniform_prior,
)

__all__ = [
  "FINAL_ANSWER_MARKER",
  "RECORD_FIELDS",
  "TASKS",
  "TASK_PRIORS",
  "ArithmeticTask",
  "CountdownTask",
  "FileQATask",
  "FormatFollowingTask",
  "GSM8KTask",
  "JsonlTask",
  "Math500Task",
  "MathTask",
  "ParquetTask",
  "Reward",
  "Task",
  "arithmetic",
  "bucket_probs",
  "check_group_size",
  "combine_with_online",
  "countdown",
  "endpoint_rewards",
  "files",
  "final_answer",
  "format_following",
  "get_task",
  "math_datasets",
  "min_group_size",
  "parse_meta",
  "risk_buckets",
  "sample_tasks",
  "signal_coverage",
  "trajval_scores",
  "trajval_weights",
  "uniform_prior",
]
