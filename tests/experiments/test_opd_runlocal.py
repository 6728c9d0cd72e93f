"""Mixed SFT → Open-MOPD (experiments/opd.py) in runlocal mode: metrics, errors, exact resume."""

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_post.training import opd
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, XLA_FLAGS="")
CONFIG = ROOT / "configs" / "opd_mix.py"
DOMAINS = ("arith", "countdown", "format")


def _load_config():
  spec = importlib.util.spec_from_file_location("opd_mix", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(binary, arg, workdir, *extra, check=True, env=ENV):
  command = [sys.executable, str(ROOT / "experiments" / binary), f"--config={CONFIG}:{arg}",
             f"--workdir={workdir}", *extra]
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_config_variants():
  module = _load_config()
  for method in module.METHOD_NAMES:
    config = module.get_config(f"method={method},root=/r")
    assert opd.resolve_method(config.method) == opd.METHODS.get(method)
    assert config.init_from == "/r/sft" and config.teachers.format == "/r/teacher_format"
  assert module.get_config("steps=0").steps == 0 and module.get_config("").steps == 50
  sft = module.get_config("sft")
  assert (sft.task, sft.prompt_len, sft.completion_len) == ("mixture", 96, 72)
  assert module.get_config("runlocal").model == module.get_config("sft,runlocal").model == "tiny"
  with pytest.raises(ValueError, match="unknown method"):
    module.get_config("method=mopd")
  # RouteOPD students: one domain, its teacher only; countdown keeps its two numbers.
  only = module.get_config("only=countdown,root=/r")
  assert list(only.task_knobs.components) == ["countdown"] and list(only.teachers) == ["countdown"]
  assert only.task_knobs.components.countdown.knobs.num_numbers == 2
  with pytest.raises(ValueError, match="only='code' is not a domain"):
    module.get_config("only=code")
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 12 and {kw["method"] for kw in added} == set(module.METHOD_NAMES)


def test_mixed_sft_then_open_mopd_with_sft_teachers_and_exact_resume(tmp_path):
  sft = tmp_path / "sft"
  _run("sft.py", "sft,runlocal", sft)
  assert any("eval/accuracy" in r for r in read_metrics(sft))

  # A domain without a teacher fails at start-up, before anything compiles.
  failed = _run("opd.py", "runlocal", tmp_path / "bad", f"--config.teachers.arith={sft}",
                check=False)
  assert failed.returncode != 0
  assert "no teacher checkpoint for domain(s) 'countdown', 'format'" in failed.stderr

  # The SFT checkpoint is every domain's teacher; the student starts from scratch, so the
  # distillation signal is not zero (a student equal to its teachers would get r = 0).
  teachers = [f"--config.teachers.{d}={sft}" for d in DOMAINS]
  run = tmp_path / "open_mopd"
  result = _run("opd.py", "runlocal", run, *teachers, env=dict(ENV, JAX_LOG_COMPILES="1"))
  # Every kernel compiles once for the whole run: the update step; the student's full-batch
  # score and the teachers' fixed `rows_per_call` score (shared by all teachers); sampling and
  # greedy evaluation (shared by the student and the RouteRL teachers, all domains).
  compiles = collections.Counter(re.findall(r"Compiling jit\((\w+)\)", result.stderr))
  assert (compiles["step"], compiles["_score"], compiles["jitted_decode"]) == (1, 2, 2), compiles
  records = read_metrics(run)
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2, 3, 4]
  route = next(r for r in records if "route/total" in r)
  assert route["step"] == 0 and all(f"route/{d}/accuracy" in route for d in DOMAINS)
  evals = [r for r in records if "eval/total" in r]
  assert [r["step"] for r in evals] == [0, 2, 4]
  assert all(f"eval/{d}/accuracy" in r for r in evals for d in DOMAINS)
  for r in train:
    assert r["train/num_updates"] == 4  # open_mopd: K = 4 inner updates
    assert r["train/staleness_kl_last"] > 0  # updates 2..4 saw a moved student
    for d in DOMAINS:
      for key in ("token_share", "prompt_share", "budget_share", "mean_abs_reward", "weight",
                  "gap_factor", "staleness_kl", "clip_frac", "reward_correct"):
        assert f"domain/{d}/{key}" in r, (d, key)
    assert abs(sum(r[f"domain/{d}/token_share"] for d in DOMAINS) - 1) < 1e-5
    assert [r[f"domain/{d}/prompt_share"] for d in DOMAINS] == [3 / 8, 3 / 8, 2 / 8]
    assert r["rollout/topk_logp_abs_diff_max"] < 1e-4  # sampler and trainer agree on s
  checkpoints = run / "checkpoints"
  assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [2, 4]

  # Resume: drop the last checkpoint and rerun the same command. Steps 3-4 are redone from
  # checkpoint 2 (state, quota-sampler position, step-0 references) and match the first run.
  shutil.rmtree(checkpoints / "4")
  _run("opd.py", "runlocal", run, *teachers)
  again = [r for r in read_metrics(run) if "train/loss" in r]
  assert [r["step"] for r in again] == [1, 2, 3, 4]
  for a, b in zip(train, again):
    for key in ("train/loss", "train/reward_mean", "train/staleness_kl_last",
                "rollout/completion_length_mean", "domain/format/token_share",
                "domain/arith/weight"):
      assert abs(a[key] - b[key]) < 1e-5, (key, a["step"], a[key], b[key])
  assert sum("route/total" in r for r in read_metrics(run)) == 1  # not re-evaluated
