"""CD-RFT on the one loop (configs/cd_rft.py, runlocal on the task mixture): the loss gains the
SCB penalty over the mixture's families, θ⁰ is the starting policy also after a restart (a run
stopped after 2 steps and resumed repeats the uninterrupted one), and the config's errors and
sweep."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import control_regularizer
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cd_rft.py"
KEYS = ("train/loss", "train/cd_rft_scb", "train/cd_rft_penalty", "train/cd_rft_families")


def _config(arg="runlocal", **overrides):
  config = load_module(CONFIG).get_config(arg)
  config.update(dict(eval_every=100, eval_at_start=False) | overrides)
  return config


def test_cd_rft_penalises_shared_control_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config("runlocal,gamma=0.1", init_from=init), tmp_path / "straight")
  records = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  part = straight.parts["control"]
  assert part.names == ["layers/0/attn", "layers/0/mlp", "layers/1/attn", "layers/1/mlp"]
  for r in records:
    assert all(k in r for k in KEYS)
    assert 0.0 <= r["train/cd_rft_scb"] <= 1.0 + 1e-6
    np.testing.assert_allclose(r["train/cd_rft_penalty"], 0.1 * r["train/cd_rft_scb"],
                               rtol=1e-5, atol=1e-8)
    assert sum(r[f"cd_rft/rows_{d}"] for d in part.domains) == 32  # 4 prompts × 8 rollouts
  # The first update starts at θ⁰ (Δθ = 0): no control yet. Once θ has moved, both families
  # (1- and 3-digit arithmetic) exert control and the penalty is on.
  assert records[0]["train/cd_rft_families"] == 0.0 and records[0]["train/cd_rft_scb"] == 0.0
  assert any(r["train/cd_rft_families"] == 2.0 and r["train/cd_rft_penalty"] > 0
             for r in records[1:])

  train_grpo(_config("runlocal,gamma=0.1", init_from=init, steps=2), tmp_path / "resumed")
  train_grpo(_config("runlocal,gamma=0.1", init_from=init), tmp_path / "resumed")
  again = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  for key in KEYS:
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key


def test_displacement_scaled_variant_runs_without_evaluation(tmp_path, format_writer_policy):
  # scale=displacement: the logged penalty is γ·‖Δθ_K‖·SCB, not γ·SCB. eval_examples = 0 turns
  # held-out evaluation off: no eval metrics and no outcomes, at step 0 or at the end.
  config = _config("runlocal,gamma=0.1,scale=displacement", init_from=str(format_writer_policy),
                   steps=3, eval_examples=0, eval_at_start=True, eval_every=1)
  assert config.control.scale == "displacement"
  train_grpo(config, tmp_path)
  records = read_metrics(tmp_path)
  assert not [r for r in records if any(k.startswith("eval/") for k in r)]
  assert not (tmp_path / "eval_outcomes").exists()
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2, 3]
  on = [r for r in train if r["train/cd_rft_scb"] > 0]
  assert on, "the penalty never turned on"
  for r in on:  # ‖Δθ‖ after 1-2 AdamW steps at the runlocal lr is well below 1
    assert 0 < r["train/cd_rft_penalty"] < 0.1 * r["train/cd_rft_scb"]


def test_config_builds_prompts_fit_and_sweep_builds():
  module = load_module(CONFIG)
  for arg in (None, "runlocal", "gamma=0.1"):
    config = module.get_config(arg)
    assert config.num_micro_batches == 1 and config.ppo_mini_batches == 1
    task = get_task(config.task, **dict(config.task_knobs))
    tokenizer = get_tokenizer(config.tokenizer)
    longest = max(len(tokenizer.encode(task.make_example("train", i)["prompt"]))
                  for i in range(100))
    assert longest <= config.prompt_len
    assert control_regularizer.build_control_regularizer(config, task) is not None
  assert module.get_config(None).control.gamma == 0.01
  runs = []
  module.sweep(lambda **kw: runs.append(kw))
  assert sorted((r["seed"], r["control.gamma"]) for r in runs) == [
    (s, g) for s in (0, 1, 2) for g in (0.0, 0.01, 0.1)]
  with pytest.raises(ValueError, match="task='arith'"):
    module.get_config("task=arith")


@pytest.mark.parametrize("overrides, match", [
  ({"num_micro_batches": 2}, "config.num_micro_batches = 1"),
  ({"ppo_mini_batches": 2}, "config.ppo_mini_batches = 1"),
  ({"control.gamma": -1.0}, "config.control.gamma must be >= 0"),
  ({"control.name": "l2"}, "config.control.name='l2'"),
])
def test_cd_rft_config_errors_name_the_key(overrides, match):
  config = _config()
  for key, value in overrides.items():
    if "." in key:
      section, name = key.split(".")
      config[section][name] = value
    else:
      config[key] = value
  task = get_task(config.task, **dict(config.task_knobs))
  with pytest.raises(ValueError, match=match):
    control_regularizer.build_control_regularizer(config, task)
