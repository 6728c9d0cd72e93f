"""experiments/reflect_rl.py in runlocal mode: 2 steps, then the same workdir continued to 3
(it resumes at step 2: the data position and the schedule carry on), and a reflective prompt
that does not fit `config.prompt_len` fails at start-up naming the key; the OPD variant
(Eq. 11, `slow`) runs with a teacher.

The policy starts from the format writer (tests/experiments/conftest.py), so some groups have
reward variance and the losses are not all zero. runlocal's schedule: K_t = 2, 1, 1 of N = 4
at steps 1, 2, 3 (a fixed 5-step transition). Measured on 2 cores with a background job: the
run + resume test ≈ 26 s with a warm compilation cache (~/.cache/jaxrl_post), ≈ 46 s cold;
the start-up error ≈ 4 s; the OPD run (`slow`) ≈ 11 s warm.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_post.models.hf import load_hf, save_hf
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, XLA_FLAGS="")
REFLECT_KEYS = ("reflect/fraction", "reflect/count", "reflect/reward_reflective",
                "reflect/reward_direct", "reflect/prompts_with_negative")


def _run(arg, workdir, *extra, check=True):
  command = [sys.executable, str(ROOT / "experiments" / "reflect_rl.py"),
             f"--config={ROOT / 'configs' / 'reflect_rl.py'}:{arg}", f"--workdir={workdir}",
             *extra]
  result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def _train(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def _method_state(workdir, step):
  return json.loads((workdir / "checkpoints" / str(step) / "extra" / "metadata").read_text())


def test_runlocal_writes_reflect_metrics_and_continues_from_its_checkpoint(
    format_writer_policy, tmp_path):
  run = tmp_path / "run"
  init = f"--config.init_from={format_writer_policy}"
  _run("runlocal,steps=2", run, init)
  first = _train(run)
  assert [r["step"] for r in first] == [1, 2]
  for r in first:
    assert all(k in r for k in REFLECT_KEYS), sorted(r)
    for key in ("train/loss", "train/grad_norm", "train/reward_format"):
      assert math.isfinite(r[key]), (r["step"], key, r[key])
  assert [r["reflect/count"] for r in first] == [2, 1]
  assert all(r["reflect/prompts_with_negative"] > 0 for r in first)
  # K_t rows of each prompt with a negative: the realised share is K/N × that share.
  for r in first:
    assert math.isclose(r["reflect/rows_reflective"],
                        r["reflect/count"] / 4 * r["reflect/prompts_with_negative"])
    assert 0.0 <= float(r["reflect/reward_reflective"]) <= 1.0
  assert max(abs(r["train/loss"]) for r in first) > 1e-4  # not a run of zeros
  assert _method_state(run, 2)["method"]["data"]["next_index"] == 2
  evals = [r["step"] for r in read_metrics(run) if "eval/accuracy" in r]
  assert evals == [0, 2]

  # The same workdir with steps=3: starts at step 2's checkpoint, runs step 3 only.
  result = _run("runlocal", run, init)
  assert "reflect_rl: start workdir" in result.stderr
  again = _train(run)
  assert [r["step"] for r in again] == [1, 2, 3]
  assert again[:2] == first  # steps 1-2 are the first run's, untouched
  assert again[2]["reflect/count"] == 1  # τ = 3/5: g = 0.173, K = round(0.69) = 1
  assert math.isfinite(again[2]["train/loss"])
  assert _method_state(run, 3)["method"]["data"]["next_index"] == 3
  evals = [r["step"] for r in read_metrics(run) if "eval/accuracy" in r]
  assert evals == [0, 2, 3]  # no second step-0 evaluation after the restart


def test_reflective_prompt_too_long_fails_at_start_up_naming_the_key(tmp_path):
  result = _run("runlocal", tmp_path / "run", "--config.prompt_len=64", check=False)
  assert result.returncode != 0
  assert "more than config.prompt_len=64; raise config.prompt_len" in result.stderr
  assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing ran


@pytest.mark.slow
def test_opd_variant_runlocal(format_writer_policy, tmp_path):
  """mode=opd: the student samples x^D only; a teacher (the format writer with its head ×0.5,
  so the two differ) scores K^batch = round(B g) rows under x^R: 7, 5, 3 of 16."""
  teacher = load_hf(format_writer_policy)
  teacher.lm_head.set_value(0.5 * teacher.lm_head.get_value())
  save_hf(teacher, tmp_path / "teacher")
  run = tmp_path / "run"
  _run(f"runlocal,mode=opd,teacher={tmp_path / 'teacher'}", run,
       f"--config.init_from={format_writer_policy}")
  train = _train(run)
  assert [r["step"] for r in train] == [1, 2, 3]
  assert [r["reflect/count"] for r in train] == [7, 5, 3]
  for r in train:
    assert r["reflect/rows_reflective"] == 0.0  # the student never sees x^R
    assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
    assert r["reflect/teacher_gap_mean"] < -1e-3  # a flatter teacher: d_t < 0
    # K^batch rows, capped at the rows of prompts that have a negative.
    assert r["reflect/teacher_rows_reflective"] == min(
      r["reflect/count"], 16 * r["reflect/prompts_with_negative"]) / 16
