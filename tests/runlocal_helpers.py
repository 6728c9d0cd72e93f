"""What the methods' runlocal tests share: train a GRPO-family method on the one loop, or run a
binary in a subprocess, read the per-step training records back, and compare logged values."""

import math
import os
import subprocess
import sys
from pathlib import Path

from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


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


def subprocess_env(cache_dir, **extra) -> dict[str, str]:
  """The environment of a binary run in a subprocess: one CPU device and a persistent
  compilation cache in `cache_dir`, which the test's runs share so that the later ones compile
  (almost) nothing; `extra` adds variables."""
  return dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu",
              JAX_COMPILATION_CACHE_DIR=str(cache_dir),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **extra)


def run_binary(binary: str, config: str, workdir, env, *flags: str, ok: bool = True,
               timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs `experiments/<binary>` with `--config=<config> --workdir=<workdir> <flags>`; unless
  `ok` is False, fails the test (with the end of stderr) when it exits non-zero."""
  command = [sys.executable, str(ROOT / "experiments" / binary), f"--config={config}",
             f"--workdir={workdir}", *flags]
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
  if ok:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def budget_records(workdir) -> list[dict]:
  """A multi-turn run's per-step training records (those with `budget/step_tokens`), in order."""
  return [r for r in read_metrics(workdir) if "budget/step_tokens" in r]
