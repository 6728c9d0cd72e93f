"""MoE GRPO on the one loop (configs/moe_proxy.py, runlocal): the load-balancing loss is in the
objective, an injected fault runs, and a stopped-and-resumed run repeats the uninterrupted one."""

from pathlib import Path

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg="runlocal", **overrides):
  config = load_module(ROOT / "configs" / "moe_proxy.py").get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def _records(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def test_moe_grpo_trains_with_aux_loss_and_resumes_exactly(tmp_path):
  arg = "runlocal,fault=logp_precision"
  loop.train(_config(arg), tmp_path / "straight", GRPO(_config(arg)))
  records = _records(tmp_path / "straight")
  assert len(records) == 4
  assert all(r["train/moe_aux_loss"] > 0 and "fault/logp_gap" in r for r in records)
  loop.train(_config(arg, steps=2), tmp_path / "resumed", GRPO(_config(arg, steps=2)))
  loop.train(_config(arg), tmp_path / "resumed", GRPO(_config(arg)))
  again = _records(tmp_path / "resumed")
  for key in ("train/loss", "train/moe_aux_loss", "fault/logp_gap"):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key
