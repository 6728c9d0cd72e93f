"""configs/flow_grpo.py + methods/flow_grpo.py in runlocal mode: flow-matching pretraining, GRPO
from it, a stopped-and-resumed GRPO run repeating the uninterrupted one, config errors."""

from pathlib import Path

import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.flow_grpo import FlowGRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "flow_grpo.py")


def _train(workdir, arg, **overrides):
  config = CONFIG.get_config(arg)
  config.update(overrides)
  loop.train(config, workdir, FlowGRPO(config))
  return read_metrics(workdir)


def test_pretrain_then_grpo_resumes_exactly(tmp_path):
  pre = _train(tmp_path / "pre", "runlocal,method=pretrain")
  assert [r["step"] for r in pre if "train/loss" in r] == [1, 2, 3]
  start = str(tmp_path / "pre")
  straight = _train(tmp_path / "straight", "runlocal,method=grpo", init_from=start)
  _train(tmp_path / "resumed", "runlocal,method=grpo", init_from=start, steps=1)
  resumed = _train(tmp_path / "resumed", "runlocal,method=grpo", init_from=start)
  config = CONFIG.get_config("runlocal,method=grpo")
  rows = config.flow.group_size * config.flow.prompts_per_step
  for records in (straight, resumed):
    train = [r for r in records if "train/reward" in r]
    assert [r["step"] for r in train] == [1, 2]
    # reweight: T forwards per sample, none recomputed.
    assert all(r["train/forwards"] == rows * config.flow.num_steps for r in train)
  keys = ("train/loss", "train/reward", "train/grad_norm", "train/kl")
  a = [r for r in straight if "train/reward" in r]
  b = [r for r in resumed if "train/reward" in r]
  for x, y in zip(a, b, strict=True):
    for key in keys:
      assert x[key] == y[key], (x["step"], key)
  evals = [r for r in resumed if "eval/reward" in r]
  assert evals[0]["eval/kl_pretrained"] < 1e-9  # step 0: the policy is the pretrained one
  assert evals[-1]["eval/kl_pretrained"] > 0
  assert evals[-1]["step"] == 2 and 0 < evals[-1]["eval/mode_coverage"] <= 1


def test_config_variants_and_errors():
  config = CONFIG.get_config("")
  assert (config.method, config.steps, config.flow.num_steps, config.flow.a) == (
    "pretrain", 1500, 10, 0.7)
  grpo = CONFIG.get_config("method=grpo,schedule=native,fraction=0.2")
  assert (grpo.steps, grpo.flow.schedule, grpo.flow.timestep_fraction) == (200, "native", 0.2)
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 9 and {kw["seed"] for kw in added} == {0, 1, 2}
  with pytest.raises(ValueError, match="unknown method 'sft'"):
    CONFIG.get_config("method=sft")
  with pytest.raises(ValueError, match="config.init_from: method 'grpo' starts from"):
    FlowGRPO(CONFIG.get_config("runlocal,method=grpo"))
  bad = CONFIG.get_config("runlocal,method=grpo,schedule=lazy")
  bad.init_from = "/tmp/x"
  with pytest.raises(KeyError, match="unknown gradient_schedule 'lazy'"):
    FlowGRPO(bad)
  bad = CONFIG.get_config("runlocal,method=pretrain,fraction=1.5")
  with pytest.raises(ValueError, match=r"config.flow: timestep_fraction=1.5 must be in \(0, 1\]"):
    FlowGRPO(bad)
  bad = CONFIG.get_config("runlocal")
  bad.target = (1.0, 2.0, 3.0)
  with pytest.raises(ValueError, match=r"config.target=\(1.0, 2.0, 3.0\) must have 2"):
    FlowGRPO(bad)
