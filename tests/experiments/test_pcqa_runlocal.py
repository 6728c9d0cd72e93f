"""experiments/pcqa.py end to end in runlocal mode (subprocess), and its config's variants."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pcqa_synthetic.py"
ENV = dict(os.environ, XLA_FLAGS="")


def _load_config():
  spec = importlib.util.spec_from_file_location("pcqa_synthetic", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_config_variants_and_errors():
  module = _load_config()
  config = module.get_config("")
  assert config.methods.split(",") == list(module.METHOD_NAMES)
  assert (config.grpo.num_samples, config.grpo.epsilon, config.grpo.beta) == (4, 0.2, 0.04)
  assert (config.grpo.sigma, config.grpo.gaussian_units) == (0.5, "score")
  assert module.get_config("methods=sft;full,seeds=2").methods == "sft,full"
  local = module.get_config("runlocal")
  assert local.num_seeds == 1 and local.rl_steps == 2
  assert (config.capable_steps, config.rl_optimizer.lr) == (0, 3e-4)
  capable = module.get_config("runlocal,capable=2,rl_lr=3e-5")
  assert (capable.capable_steps, capable.rl_optimizer.lr) == (2, 3e-5)
  assert capable.sft_optimizer.lr == config.sft_optimizer.lr
  with pytest.raises(ValueError, match="capable=-1 must be >= 0"):
    module.get_config("capable=-1")
  assert module.get_config("capable=2,holdout=0.5").capable_holdout == 0.5
  with pytest.raises(ValueError, match=r"holdout=1.0 must be in \[0, 1\)"):
    module.get_config("holdout=1.0")
  with pytest.raises(ValueError, match=r"unknown method\(s\) \['grpo'\]"):
    module.get_config("methods=grpo")
  with pytest.raises(ValueError, match="unknown config arg 'sigma'"):
    module.get_config("sigma=1")
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 9 and {kw["source"] for kw in added} == {"syn_a", "syn_b", "syn_c"}


def _run(workdir, *extra, variant="runlocal"):
  command = [sys.executable, str(ROOT / "experiments" / "pcqa.py"),
             f"--config={CONFIG}:{variant}", f"--workdir={workdir}", *extra]
  return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900,
                        check=False)


@pytest.mark.slow
def test_runlocal_all_methods_end_to_end_then_skips_finished_runs(tmp_path):
  result = _run(tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  datasets = ("syn_a", "syn_b", "syn_c")
  for method in ("base", "sft", "rank", "rank_gauss", "full", "regression"):
    run = tmp_path / "seed_0" / method
    final = json.loads((run / "final.json").read_text())
    for d in datasets:
      assert f"{d}/plcc" in final and f"{d}/srcc" in final, (method, d)
    assert (run / "checkpoints").is_dir() and (run / "config.json").exists()
    records = read_metrics(run)
    assert any("eval/avg/plcc" in r for r in records), method
  grpo = [r for r in read_metrics(tmp_path / "seed_0" / "full") if "reward/total" in r]
  # The cold start (1 SFT step) comes first, so GRPO logs steps 2 and 3.
  assert [r["step"] for r in grpo] == [2, 3]
  assert all(0.0 <= r["reward/unparseable"] <= 1.0 and r["reward/format_weight"] <= 1.0
             for r in grpo)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert set(summary) == {"sft", "rank", "rank_gauss", "full", "regression"}
  assert "| regression | 1 |" in result.stdout

  # A rerun finds every final.json and trains nothing.
  again = _run(tmp_path)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stderr.count("done, skipped") == 5 and "base stage restored" in again.stderr

  bad = _run(tmp_path / "bad", "--config.source=sjtu")
  assert bad.returncode != 0 and "config.source='sjtu' is not in config.datasets" in bad.stderr


def _params(run: Path, step: int):
  state = ocp.StandardCheckpointer().restore(run / "checkpoints" / str(step) / "state")
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


@pytest.mark.slow
def test_runlocal_capable_stage_is_the_start_of_every_lm_method(tmp_path):
  # capable = 2 SFT steps after the 2 base steps; rl_lr = 0 freezes GRPO, so a GRPO run's final
  # params must equal the params it started from: capable's, not base's. holdout = 0.5 splits the
  # 32 runlocal clouds 16 / 16 between capable and the methods after it.
  result = _run(tmp_path, variant="runlocal,capable=2,rl_lr=0,holdout=0.5")
  assert result.returncode == 0, result.stderr[-3000:]
  seed = tmp_path / "seed_0"
  capable = json.loads((seed / "capable" / "final.json").read_text())
  assert "syn_a/srcc" in capable
  assert [r["step"] for r in read_metrics(seed / "capable") if "eval/avg/plcc" in r] == [1, 2]
  base_params, capable_params = _params(seed / "base", 2), _params(seed / "capable", 2)
  assert any(not np.array_equal(b, c) for b, c in zip(base_params, capable_params))
  for method in ("rank", "rank_gauss"):
    # Steps continue from capable's 2: GRPO logs steps 3 and 4 and saves at step 4.
    grpo = [r["step"] for r in read_metrics(seed / method) if "reward/total" in r]
    assert grpo == [3, 4], method
    for p, c in zip(_params(seed / method, 4), capable_params, strict=True):
      np.testing.assert_array_equal(p, c, err_msg=method)
    final = json.loads((seed / method / "final.json").read_text())
    for d in ("syn_a", "syn_b", "syn_c"):  # same params, same greedy answers
      assert final[f"{d}/rmse"] == capable[f"{d}/rmse"], (method, d)
  # full: cold start (step 3) from capable, then GRPO (steps 4, 5).
  full = read_metrics(seed / "full")
  assert [r["step"] for r in full if "sft/nll" in r] == [3]
  assert [r["step"] for r in full if "reward/total" in r] == [4, 5]
  assert [r["step"] for r in read_metrics(seed / "sft") if "sft/nll" in r] == [3, 4, 5]
  # regression: from base for capable + cold start + rl = 2 + 1 + 2 steps.
  regression = [r["step"] for r in read_metrics(seed / "regression") if "regression/mse" in r]
  assert regression == [1, 2, 3, 4, 5]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert set(summary) == {"capable", "sft", "rank", "rank_gauss", "full", "regression"}
  assert "| capable | 1 |" in result.stdout and "seed 0 capable(2) ID PLCC/SRCC" in result.stdout

  again = _run(tmp_path, variant="runlocal,capable=2,rl_lr=0,holdout=0.5")
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stderr.count("done, skipped") == 5 and "capable stage restored" in again.stderr
