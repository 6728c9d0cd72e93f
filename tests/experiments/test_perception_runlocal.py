"""experiments/perception.py, runlocal: SFT → GRPO end to end, config variants, errors, resume."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_post.rewards.set_matching import SET_REWARDS
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, XLA_FLAGS="")
CONFIG = ROOT / "configs" / "perception_dense.py"


def _load_config():
  spec = importlib.util.spec_from_file_location("perception_dense", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(arg, workdir, *extra, check=True):
  command = [sys.executable, str(ROOT / "experiments" / "perception.py"),
             f"--config={CONFIG}:{arg}", f"--workdir={workdir}", *extra]
  result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_config_variants_and_sweep():
  module = _load_config()
  for arg in ("", "runlocal", "phase=rl", "phase=sft_more,runlocal", "phase=rl,detach=false"):
    config = module.get_config(arg)
    assert config.size_bins >= config.task.max_size
    assert config.coord_bins >= 2 * config.image_size  # Exact half-pixel centres.
    assert config.image_size % config.patch_size == 0
    SET_REWARDS.get(config.rl.reward)
  assert module.get_config("phase=rl,detach=false").rl.detach_existence is False
  assert module.get_config("steps=7").steps == 7
  assert module.get_config("runlocal").steps == 4
  with pytest.raises(ValueError, match="phase='ppo'"):
    module.get_config("phase=ppo")
  with pytest.raises(ValueError, match="unknown config arg 'lr'"):
    module.get_config("lr=1")
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 12 and {kw["phase"] for kw in added} == {"sft", "rl", "sft_more"}


@pytest.mark.slow
def test_sft_then_grpo_end_to_end_and_resume(tmp_path):
  sft = tmp_path / "sft"
  _run("runlocal,steps=2", sft)
  records = read_metrics(sft)
  assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
  assert any("eval/dense/f1@0.5" in r and "eval/ref/mcc" in r for r in records)

  # RL needs a starting point; the error names the config key.
  failed = _run("runlocal,phase=rl", tmp_path / "bad", check=False)
  assert failed.returncode != 0 and "config.init_from" in failed.stderr

  rl = tmp_path / "rl"
  _run("runlocal,phase=rl,steps=2", rl, f"--config.init_from={sft}")
  train = [r for r in read_metrics(rl) if "train/reward" in r]
  assert [r["step"] for r in train] == [1, 2]
  for key in ("train/pred_per_gt", "train/malformed_rate", "train/is_weight_mean",
              "train/clipcov_lm_frac", "train/entropy_coord", "train/grad_norm"):
    assert key in train[0]
  assert all(r["train/reward"] <= 0 for r in train)  # −(FN + 0.3·FP) ≤ 0.

  # Restarted with more steps, the run resumes from its checkpoint at step 2.
  result = _run("runlocal,phase=rl,steps=3", rl, f"--config.init_from={sft}")
  train = [r for r in read_metrics(rl) if "train/reward" in r]
  assert [r["step"] for r in train] == [1, 2, 3]
  assert "referring MCC" in result.stdout
