"""experiments/pcqa.py (one run per stage / method) and scripts/pcqa_grid.py in runlocal mode.

The binaries run in subprocesses; on 2 loaded cores each run takes 20-60 s (mostly
compilation), hence `slow` for everything but the config checks.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pcqa_synthetic.py"
ONE_DEVICE = dict(os.environ, XLA_FLAGS="")
EIGHT_DEVICES = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
DATASETS = ("syn_a", "syn_b", "syn_c")


def _load_config():
  return load_module(CONFIG, "pcqa_synthetic")


def test_config_variants_sweep_order_and_errors():
  module = _load_config()
  config = module.get_config("")
  assert (config.method, config.steps, config.optimizer.lr) == ("base", 300, 2e-3)
  assert (config.grpo.num_samples, config.grpo.epsilon, config.grpo.beta) == (4, 0.2, 0.04)
  assert (config.grpo.sigma, config.grpo.gaussian_units) == (0.5, "score")
  rank = module.get_config("method=rank")
  # The paper's 14 GRPO epochs of 25 steps (400 source clouds / 16 prompts per step).
  assert (rank.rl_epochs, rank.steps, rank.optimizer.lr, rank.eval_every) == (14, 350, 3e-4, 50)
  rank.rl_steps = 10  # what --config.rl_steps=10 does: the run's length follows
  assert rank.steps == 10
  assert module.get_config("method=rank,rl_epochs=7").steps == 175  # before issue 28
  assert module.get_config("method=rank,rl_steps=30,rl_epochs=7").steps == 30
  # With held-out RL prompts an epoch is a pass over GRPO's 200 held-out clouds: 14 · 200 / 16.
  assert module.get_config("method=rank,capable=1000,holdout=0.5").steps == 175
  assert module.get_config("method=regression,capable=1000,holdout=0.5").steps == 1200
  assert module.get_config("method=sft").steps == 375  # cold start + GRPO: 15 epochs
  assert module.get_config("method=regression,capable=2").steps == 377
  # The dataset shift picks the targets; the source stays first.
  assert config.shift == "monotone" and config.datasets == "syn_a,syn_b,syn_c"
  assert module.get_config("shift=non_monotone").datasets == "syn_a,syn_d,syn_e"
  assert module.get_config("method=regression").optimizer.lr == 1e-3
  assert module.get_config("method=cold_start").eval_every == 0  # evaluated at its end only
  capable = module.get_config("runlocal,capable=2,rl_lr=3e-5,method=capable")
  assert (capable.steps, capable.rl_optimizer.lr, capable.optimizer.lr) == (2, 3e-5, 2e-3)
  for arg, message in (("capable=-1", "capable=-1 must be >= 0"),
                       ("holdout=1.0", r"holdout=1.0 must be in \[0, 1\)"),
                       ("method=grpo", "unknown method 'grpo'"),
                       ("method=capable", "method=capable needs capable=<n> > 0"),
                       ("shift=reversed", "unknown shift='reversed'.*non_monotone"),
                       ("shift=non_monotone,source=syn_b", "shift=non_monotone needs source=syn_a"),
                       ("rl_epochs=0", "rl_epochs=0 must be > 0"),
                       ("sigma=1", "unknown config arg 'sigma'")):
    with pytest.raises(ValueError, match=message):
      module.get_config(arg)

  def runs(arg):
    added = []
    module.sweep(lambda **kw: added.append(kw), arg)
    return [(kw["seed"], kw["method"], kw.get("start")) for kw in added]

  assert runs("runlocal") == [
    (0, "base", None), (0, "sft", "base"), (0, "rank", "base"), (0, "rank_gauss", "base"),
    (0, "cold_start", "base"), (0, "full", "cold_start"), (0, "regression", "base")]
  assert runs("capable=5,methods=full;regression,seeds=2")[:5] == [
    (0, "base", None), (0, "capable", "base"), (0, "cold_start", "capable"),
    (0, "full", "cold_start"), (0, "regression", "base")]
  assert len(runs("")) == 21
  with pytest.raises(ValueError, match=r"unknown method\(s\) \['grpo'\]"):
    runs("methods=grpo")


def test_a_method_without_its_start_or_with_the_wrong_length_fails_naming_the_key(tmp_path):
  from jaxrl_post.methods.pcqa import PCQA

  module = _load_config()
  with pytest.raises(ValueError, match="config.init_from: method 'rank' starts from"):
    PCQA(module.get_config("runlocal,method=rank"))
  config = module.get_config("runlocal,method=base")
  config.method = "sft"  # what --config.method=sft does: base's length and optimizer
  config.init_from = str(tmp_path)
  with pytest.raises(ValueError, match="pick the method with the config argument"):
    PCQA(config)


def _grid(workdir, arg="runlocal", *extra):
  command = [sys.executable, str(ROOT / "scripts" / "pcqa_grid.py"), f"--config={CONFIG}:{arg}",
             f"--workdir={workdir}", *(["--", *extra] if extra else [])]
  return subprocess.run(command, capture_output=True, text=True, env=ONE_DEVICE, timeout=1800,
                        check=False)


def _run(workdir, arg, env=ONE_DEVICE, *extra):
  command = [sys.executable, str(ROOT / "experiments" / "pcqa.py"), f"--config={CONFIG}:{arg}",
             f"--workdir={workdir}", *extra]
  return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900,
                        check=False)


def _params(run: Path, step: int):
  state = ocp.StandardCheckpointer().restore(run / "checkpoints" / str(step) / "state")
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


@pytest.mark.slow
def test_runlocal_grid_end_to_end_capable_start_then_skips_finished_runs(tmp_path):
  # One grid (its 8 runs are the suite's most expensive subprocesses) checks three things:
  # every run ends with its metrics and checkpoints; the capable run is the start of every LM
  # method; a rerun trains nothing. capable = 2 SFT steps after the 2 base steps; rl_lr = 0
  # freezes GRPO, so a GRPO run's final params must equal the params it started from:
  # capable's, not base's. holdout = 0.5 splits the 32 runlocal clouds 16 / 16 between capable
  # and the methods after it.
  arg = "runlocal,capable=2,rl_lr=0,holdout=0.5"
  result = _grid(tmp_path, arg)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  seed = tmp_path / "seed_0"
  for method in ("base", "capable", "sft", "rank", "rank_gauss", "cold_start", "full",
                 "regression"):
    run = seed / method
    final = json.loads((run / "final.json").read_text())
    for d in DATASETS:
      assert f"{d}/plcc" in final and f"{d}/srcc" in final, (method, d)
    assert (run / "checkpoints").is_dir() and (run / "config.json").exists()
    assert any("eval/avg/plcc" in r for r in read_metrics(run)), method
  grpo = [r for r in read_metrics(seed / "full") if "reward/total" in r]
  assert all(0.0 <= r["reward/unparseable"] <= 1.0 and r["reward/format_weight"] <= 1.0
             for r in grpo)

  capable = json.loads((seed / "capable" / "final.json").read_text())
  assert [r["step"] for r in read_metrics(seed / "capable") if "eval/avg/plcc" in r] == [1, 2]
  base_params, capable_params = _params(seed / "base", 2), _params(seed / "capable", 2)
  assert any(not np.array_equal(b, c) for b, c in zip(base_params, capable_params))
  for method in ("rank", "rank_gauss"):
    assert [r["step"] for r in read_metrics(seed / method) if "reward/total" in r] == [1, 2]
    for p, c in zip(_params(seed / method, 2), capable_params, strict=True):
      np.testing.assert_array_equal(p, c, err_msg=method)
    final = json.loads((seed / method / "final.json").read_text())
    for d in DATASETS:  # same params, same greedy answers
      assert final[f"{d}/rmse"] == capable[f"{d}/rmse"], (method, d)
  # full: its cold start (1 step) from capable, then GRPO (2 steps) from the cold start.
  assert [r["step"] for r in read_metrics(seed / "cold_start") if "train/nll" in r] == [1]
  assert [r["step"] for r in grpo] == [1, 2]
  assert [r["step"] for r in read_metrics(seed / "sft") if "train/nll" in r] == [1, 2, 3]
  # regression: from base for capable + cold start + rl = 2 + 1 + 2 steps.
  assert [r["step"] for r in read_metrics(seed / "regression") if "train/mse" in r] == [
    1, 2, 3, 4, 5]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert set(summary) == {"capable", "sft", "rank", "rank_gauss", "full", "regression"}
  assert "| capable | 1 |" in result.stdout and "| regression | 1 |" in result.stdout

  # A rerun finds every final.json and trains nothing.
  again = _grid(tmp_path, arg)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("done, skipped") == 8

  bad = _run(tmp_path / "bad", "runlocal", ONE_DEVICE, "--config.source=sjtu")
  assert bad.returncode != 0 and "config.source='sjtu' is not in config.datasets" in bad.stderr


@pytest.mark.slow
def test_runlocal_resumes_per_step(tmp_path):
  # A fixed decay horizon makes a 1-step run the prefix of a 2-step one (the schedule decays
  # over the run's steps otherwise); its batches are functions of (seed, stage, step).
  fixed = "--config.sft_optimizer.decay_steps=8"
  straight = _run(tmp_path / "straight", "runlocal,method=base", ONE_DEVICE, fixed)
  assert straight.returncode == 0, straight.stderr[-3000:]
  first = _run(tmp_path / "resumed", "runlocal,method=base", ONE_DEVICE, fixed,
               "--config.base_steps=1")
  assert first.returncode == 0, first.stderr[-3000:]
  again = _run(tmp_path / "resumed", "runlocal,method=base", ONE_DEVICE, fixed)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "restored step 1" in again.stderr
  a = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  b = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
  for x, y in zip(a, b):
    assert x["train/loss"] == y["train/loss"] and x["train/grad_norm"] == y["train/grad_norm"]


@pytest.mark.slow
def test_runlocal_on_a_mesh_matches_one_device(tmp_path):
  # SFT (base), the regression baseline and GRPO (rank), each on data 2 × fsdp 2 × tensor 2 of a
  # fake 8-device host vs one device. In runlocal the 2-step base policy writes no parseable
  # score, so GRPO's rewards and update are 0: for it the comparison is of the sampler on the
  # mesh (the same rollouts: texts, lengths, rewards).
  mesh = ("--config.mesh.ici_data=2", "--config.mesh.ici_fsdp=2", "--config.mesh.ici_tensor=2")

  def run(name, arg, env, *extra):
    result = _run(tmp_path / name, arg, env, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return [r for r in read_metrics(tmp_path / name) if "train/loss" in r], result.stderr

  base, _ = run("base", "runlocal,method=base", ONE_DEVICE)
  base8, log = run("base8", "runlocal,method=base", EIGHT_DEVICES, *mesh)
  assert "trainer mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in log
  start = f"--config.init_from={tmp_path / 'base'}"
  regression, _ = run("regression", "runlocal,method=regression", ONE_DEVICE, start)
  regression8, _ = run("regression8", "runlocal,method=regression", EIGHT_DEVICES, start, *mesh)
  rank, _ = run("rank", "runlocal,method=rank", ONE_DEVICE, start)
  rank8, _ = run("rank8", "runlocal,method=rank", EIGHT_DEVICES, start, *mesh)
  assert [r["rollout/example"] for r in rank] == [r["rollout/example"] for r in rank8]
  for single, sharded, keys, steps in (
      (base, base8, ("train/loss", "train/grad_norm"), [1, 2]),
      (regression, regression8, ("train/loss", "train/grad_norm"), [1, 2, 3]),
      (rank, rank8, ("train/loss", "rollout/length", "reward/total", "reward/unparseable"),
       [1, 2])):
    assert [r["step"] for r in single] == [r["step"] for r in sharded] == steps
    for a, b in zip(single, sharded):
      for key in keys:
        # Float32 summation order differs across shards (and through the Adam steps): ~1e-6
        # relative; the sampled tokens, hence the rewards, are the same. 1e-4 leaves room far
        # below what a wrong normaliser or a lost shard of rows would move.
        np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6,
                                   err_msg=f"{key} at step {a['step']}")
