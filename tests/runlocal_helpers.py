"""What the methods' runlocal tests share: train a GRPO-family method on the one loop, read the
per-step training records back, and compare logged values."""

import math

from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics


def train_grpo(config, workdir) -> GRPO:
  """Runs `config` (a GRPO-family method) to `config.steps` in `workdir`, resuming from what is
  there; returns the method, whose parts hold their final state."""
  method = GRPO(config)
  loop.train(config, workdir, method)
  return method


def train_records(workdir) -> list[dict]:
  """The metrics file's per-step training records (those with `train/loss`), in order."""
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def same_logged(a, b) -> bool:
  """Equal, with NaN equal to NaN (the metrics file writes a NaN as the string "nan")."""
  a, b = (float(x) if isinstance(x, str) else x for x in (a, b))
  return a == b or (math.isnan(a) and math.isnan(b))
