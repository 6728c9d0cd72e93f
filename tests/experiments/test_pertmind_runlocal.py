"""PertMind on the one loop (configs/pertmind.py, runlocal): grammar-constrained
path-supervised GRPO; sampler and trainer log-probs agree under the
grammar, and a stopped-and-resumed run repeats the uninterrupted one."""

from pathlib import Path

import pytest
from runlocal_helpers import same_logged

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO, task_grammar
from jaxrl_post.rewards.pertmind import build_pertmind
from jaxrl_post.tasks import get_task
from jaxrl_post.tokenizers import CharTokenizer
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "pertmind.py")


def test_constrained_grpo_trains_and_resumes_exactly(tmp_path):
  # From the random init (the grammar makes every completion parse, so rewards vary without
  # SFT; the SFT stage is `CONFIG.get_config("sft")` on the existing SFT method).
  def grpo(workdir, **overrides):
    config = CONFIG.get_config("runlocal")
    config.update(dict(dict(eval_every=100, eval_at_start=False, steps=2,
                            checkpoint_every=1), **overrides))
    loop.train(config, workdir, GRPO(config))
    return [r for r in read_metrics(workdir) if "train/loss" in r]

  straight = grpo(tmp_path / "straight")
  assert [r["step"] for r in straight] == [1, 2]
  for record in straight:
    assert record["rollout/logp_abs_diff_max"] < 1e-4  # masked log-probs agree
    assert record["train/reward_format"] == 1.0  # every constrained completion parses
    assert 0.0 <= record["train/pertmind_reward"] <= 1.4
  grpo(tmp_path / "resumed", steps=1)
  again = grpo(tmp_path / "resumed")
  assert [r["step"] for r in again] == [1, 2]
  keys = ("train/loss", "train/reward_correct", "train/pertmind_reward", "train/grad_norm")
  for a, b in zip(again, straight, strict=True):
    for key in keys:
      assert same_logged(a[key], b[key]), (a["step"], key, a[key], b[key])


def test_config_variants_and_errors():
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 9 and {kw["seed"] for kw in added} == {0, 1, 2}
  assert CONFIG.get_config("reward=gene").pertmind["lambda_pw"] == 0.0
  sft = CONFIG.get_config("runlocal,sft")
  assert sft.task == "pertmind" and "constrained_decoding" not in sft
  assert CONFIG.get_config("reward=shuffled").task_knobs["pathway_labels"] == "shuffled"
  with pytest.raises(ValueError, match="reward"):
    CONFIG.get_config("reward=other")
  config = CONFIG.get_config("runlocal")
  tokenizer = CharTokenizer()
  assert task_grammar(config, get_task("pertmind"), tokenizer).num_states > 10
  config.task = "arith"
  with pytest.raises(ValueError, match="config.constrained_decoding"):
    task_grammar(config, get_task("arith"), tokenizer)
  config.pertmind = dict(lambda_pw=0.6, lambda_fmt=0.5)
  with pytest.raises(ValueError, match="config.pertmind.lambda_pw"):
    build_pertmind(config)
