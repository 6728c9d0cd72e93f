"""MoE GRPO on the one loop (configs/moe_proxy.py, runlocal): the load-balancing loss is in the
objective, an injected fault runs, and a stopped-and-resumed run repeats the uninterrupted one."""

from pathlib import Path

from runlocal_helpers import train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[2]
ARG = "runlocal,fault=logp_precision"


def _config(**overrides):
  config = load_module(ROOT / "configs" / "moe_proxy.py").get_config(ARG)
  # The least work that still checks it all: 2 steps, a checkpoint after each, one evaluation
  # (at the last step) of 2 prompts × 4 samples: the training rollouts' shapes, so their programs.
  config.update(dict(steps=2, checkpoint_every=1, eval_every=0, eval_at_start=False,
                     eval_examples=2, eval_pass_k=4) | overrides)
  return config


def test_moe_grpo_trains_with_aux_loss_and_resumes_exactly(tmp_path):
  loop.train(_config(), tmp_path / "straight", GRPO(_config()))
  records = train_records(tmp_path / "straight")
  assert [r["step"] for r in records] == [1, 2]
  assert all(r["train/moe_aux_loss"] > 0 and r["fault/logp_gap"] > 0 for r in records)
  loop.train(_config(steps=1), tmp_path / "resumed", GRPO(_config(steps=1)))
  loop.train(_config(), tmp_path / "resumed", GRPO(_config()))
  again = train_records(tmp_path / "resumed")
  for key in ("train/loss", "train/moe_aux_loss", "fault/logp_gap"):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key
