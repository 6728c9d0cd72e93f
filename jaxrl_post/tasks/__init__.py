"""Verifiable tasks: seeded prompt generators, demonstrations and verifiers.

  task = get_task("arith", max_digits=4, num_operands=3)
  record = task.make_example("train", 0)     # prompt, answer, demonstration, meta, ...
  correct, fmt = task.reward(record, completion)

Registered tasks (`TASKS`): `"arith"` (multi-digit arithmetic with worked steps),
`"countdown"` (reach a target with + - * /), `"format"` (short format-following replies),
`"jsonl"` and `"parquet"` (GSM8K-style question / answer files), `"mixture"` (several of these
as labelled domains, for multi-teacher distillation). Modules: `base` (interface,
record format, answer parsing), one module per task, `expressions` (the safe expression
evaluator) and `data` (tfds builder and grain loader; import it explicitly, as it loads
tensorflow-datasets). Two non-text data modules have their own APIs and are not registered
`Task`s: `dense_scenes` (images of up to 500+ objects with referring queries, for the dense
detector) and `point_clouds` (distorted point clouds with hidden MOS, for quality rating).
"""

from jaxrl_post.tasks import arithmetic, countdown, files, format_following
from jaxrl_post.tasks import mixture as mixture  # registers "mixture"
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

__all__ = [
  "FINAL_ANSWER_MARKER",
  "RECORD_FIELDS",
  "TASKS",
  "ArithmeticTask",
  "CountdownTask",
  "FileQATask",
  "FormatFollowingTask",
  "JsonlTask",
  "ParquetTask",
  "Reward",
  "Task",
  "arithmetic",
  "countdown",
  "files",
  "final_answer",
  "format_following",
  "get_task",
  "parse_meta",
]
