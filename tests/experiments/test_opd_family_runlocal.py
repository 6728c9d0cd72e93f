"""experiments/opd_family.py in runlocal mode: each distinct step path runs with finite metrics, bad
input fails before compiling, TV-OPD resumes exactly, and an 8-device mesh matches one device.

Models: the student starts from the format writer (tests/experiments/conftest.py), so some
groups have reward variance; the teacher is the format writer with a flatter head (×0.5) and
OPRD's teacher reference one with a head ×0.8: all three differ, so the OPD signal, the teacher
shift and the GRPO advantages are all non-zero. On 2 loaded cores a runlocal run takes 15-30 s
(mostly compilation): the fast tests are TV-OPD's run + resume and the start-up errors
(≈ 1 min); eight more methods and the mesh comparison are `slow` (≈ 4 min).
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import load_hf, save_hf
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "opd_family.py"
ONE_DEVICE = dict(os.environ, XLA_FLAGS="")
EIGHT_DEVICES = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
# One run per distinct code path of the step (tv_opd runs in the fast test): no teacher, the
# teacher's reward, the automatic switch (eval history), TRRD's ratio scale (`logp_scale`), a
# group-summed baseline, teacher probe rollouts, a verifier gate, OPRD's logits transform. The
# other names differ from these only in the pure function, which tests/methods/test_opd_family.py
# checks against the step's wiring and tests/losses checks against hand values.
SLOW_METHODS = [("grpo", ""), ("opd", ""), ("opd_then_rl", "switch=auto"), ("joint:trrd", ""),
                ("joint:hdpo", ""), ("tgopd", ""), ("opdvr", ""), ("oprd", "")]


def _run(arg, workdir, *extra, env=ONE_DEVICE, check=True):
  command = [sys.executable, str(ROOT / "experiments" / "opd_family.py"),
             f"--config={CONFIG}:{arg}", f"--workdir={workdir}", *extra]
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def _scaled_head(source: Path, path: Path, scale: float) -> Path:
  model = load_hf(source)
  model.lm_head.set_value(scale * model.lm_head.get_value())
  save_hf(model, path)
  return path


@pytest.fixture(scope="module")
def models(format_writer_policy, tmp_path_factory):
  root = tmp_path_factory.mktemp("opd_family_models")
  return dict(student=format_writer_policy,
              teacher=_scaled_head(format_writer_policy, root / "teacher", 0.5),
              teacher_ref=_scaled_head(format_writer_policy, root / "teacher_ref", 0.8))


def _flags(models, *, ref=False):
  flags = [f"--config.init_from={models['student']}",
           f"--config.distill.teacher={models['teacher']}"]
  if ref:
    flags.append(f"--config.distill.teacher_ref={models['teacher_ref']}")
  return flags


def _train(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def _assert_finite(records):
  for r in records:
    for key, value in r.items():
      assert isinstance(value, (int, float)) and math.isfinite(value), (r["step"], key, value)


def _method_state(workdir, step):
  return json.loads((workdir / "checkpoints" / str(step) / "extra" / "metadata").read_text())


def test_tv_opd_runlocal_and_exact_resume(models, tmp_path):
  run = tmp_path / "tv_opd"
  _run("method=tv_opd,runlocal", run, *_flags(models))
  train = _train(run)
  assert [r["step"] for r in train] == [1, 2, 3]
  _assert_finite(train)
  assert train[0]["distill/tv_coef"] == 1.0  # c_1 = 1
  assert all(0.1 <= r["distill/tv_coef"] <= 1.0 for r in train)
  assert all(0.0 < r["distill/tv_estimate"] <= 1.0 for r in train)
  assert max(abs(r["train/loss"]) for r in train) > 1e-3  # not a run of zeros
  final = _method_state(run, 3)["method"]
  assert final["tv"]["initialized"] and final["data"]["next_index"] == 3

  # Resume: drop checkpoint 3 and rerun. Step 3 is redone from checkpoint 2 (train state,
  # data position, TV-OPD's scheduler state) and matches the first run exactly.
  shutil.rmtree(run / "checkpoints" / "3")
  _run("method=tv_opd,runlocal", run, *_flags(models))
  again = _train(run)
  assert [r["step"] for r in again] == [1, 2, 3]
  for a, b in zip(train, again):
    for key in ("train/loss", "train/grad_norm", "distill/tv_coef", "distill/tv_estimate",
                "train/reward_correct", "rollout/completion_length_mean"):
      assert abs(a[key] - b[key]) < 1e-6, (key, a["step"], a[key], b[key])
  # D̄ of step 3 = β D̄_2 + (1 − β) D̂_3 needs step 2's restored state: equal to the bit.
  assert _method_state(run, 3)["method"]["tv"] == final["tv"]


def test_bad_input_fails_at_start_up_naming_it(models, tmp_path):
  result = _run("method=opd,runlocal", tmp_path / "a", check=False)
  assert result.returncode != 0
  assert "config.distill.method='opd' needs a teacher: set config.distill.teacher=" in (
    result.stderr)
  result = _run("method=oprd,runlocal", tmp_path / "b", *_flags(models), check=False)
  assert result.returncode != 0
  assert "needs the teacher's pre-RL reference: set config.distill.teacher_ref" in result.stderr
  result = _run("method=joint:kdrl3,runlocal", tmp_path / "c", *_flags(models), check=False)
  assert "unknown joint OPD baseline 'kdrl3'; known: hdpo, kdrl, kdrl_annealing" in result.stderr
  # A teacher with another vocabulary (a Hugging Face directory of 300 ids).
  other = tmp_path / "other_vocab"
  save_hf(CausalLM(get_model_config("tiny", vocab_size=300), rngs=nnx.Rngs(0)), other)
  result = _run("method=opd,runlocal", tmp_path / "d", f"--config.distill.teacher={other}",
                check=False)
  assert result.returncode != 0
  assert "has a vocabulary of 300 ids; the student's has" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("method, arg", SLOW_METHODS,
                         ids=[f"{m}{'-' + a if a else ''}" for m, a in SLOW_METHODS])
def test_every_method_runs_with_finite_metrics(models, method, arg, tmp_path):
  run = tmp_path / "run"
  _run(",".join(filter(None, [f"method={method}", arg, "runlocal"])), run,
       *_flags(models, ref=method == "oprd"), "--config.checkpoint_every=100")
  train = _train(run)
  assert [r["step"] for r in train] == [1, 2, 3]
  _assert_finite(train)
  evals = [r for r in read_metrics(run) if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 1, 2, 3]
  if method != "grpo":
    assert all("distill/teacher_gap_mean" in r for r in train)
  if method == "tgopd":
    assert all(0.0 <= r["distill/gate_open_frac"] <= 1.0 for r in train)
  if method == "oprd":  # the alignment diagnostics (losses.oprd_alignment) reach the metrics
    assert all(0.0 <= r["oprd/aligned_frac"] <= 1.0 for r in train)
    assert max(r["oprd/active_frac"] for r in train) > 0.0
    assert all(0.0 <= r["oprd/rel_correction_mean"] <= 0.5 for r in train)  # λ|cos|, λ ≤ 0.5
  if method == "opd_then_rl":
    phases = [r["distill/opd_phase"] for r in train]
    assert phases[0] == 1.0 and phases[-1] == 0.0  # 3 steps: S = 1 (fixed, or the budget)


@pytest.mark.slow
def test_oprd_on_a_mesh_matches_one_device(models, tmp_path):
  """data 2 × fsdp 2 × tensor 2 on a fake 8-device host vs one device: OPRD's corrected
  gradient (the custom VJP on vocabulary-sharded logit chunks) and everything before it."""
  short = ("--config.eval_every=100", "--config.checkpoint_every=100")
  _run("method=oprd,runlocal", tmp_path / "one", *_flags(models, ref=True), *short)
  result = _run("method=oprd,runlocal", tmp_path / "eight", *_flags(models, ref=True), *short,
                "--config.mesh.ici_data=2", "--config.mesh.ici_fsdp=2",
                "--config.mesh.ici_tensor=2", env=EIGHT_DEVICES)
  assert "trainer mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in result.stderr
  single, sharded = _train(tmp_path / "one"), _train(tmp_path / "eight")
  assert [r["step"] for r in sharded] == [r["step"] for r in single] == [1, 2, 3]
  assert max(r["train/grad_norm"] for r in single) > 1e-2  # not a comparison of zeros
  for a, b in zip(single, sharded):
    # The same tokens are sampled (keys by global row): equal rewards exactly.
    assert b["train/reward_correct"] == a["train/reward_correct"]
    assert b["train/reward_format"] == a["train/reward_format"]
    for key in ("train/loss", "train/grad_norm", "distill/teacher_gap_mean",
                "distill/adv_abs_mean"):
      # float32 summation order across shards only (as in test_mesh_runlocal.py).
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6,
                                 err_msg=f"{key} at step {a['step']}")
