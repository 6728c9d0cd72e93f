"""RecoverFly on the one loop (configs/recoverfly.py, runlocal): grammar-constrained GRPO with the
failure buffer, the curriculum and the windowed KL; sampler and trainer log-probs agree under
the grammar, and a stopped-and-resumed run repeats the uninterrupted one (buffer included)."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import same_logged

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.recoverfly import RecoverFly
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "recoverfly.py")


class _NoEval(RecoverFly):
  """Skips the held-out evaluation the loop runs at the last step (its greedy-decode compile is
  most of a run's time here; GRPO's evaluation is tested with the GRPO method)."""

  def evaluate(self, state, step):
    del state, step
    return {}


def test_recoverfly_trains_and_resumes_exactly(tmp_path):
  def run(workdir, **overrides):
    config = CONFIG.get_config("runlocal")
    config.update(dict(dict(eval_every=100, eval_at_start=False, steps=2, checkpoint_every=1),
                       **overrides))
    method = _NoEval(config)
    loop.train(config, workdir, method)
    return method, [r for r in read_metrics(workdir) if "train/loss" in r]

  method, straight = run(tmp_path / "straight")
  assert [r["step"] for r in straight] == [1, 2]
  for record in straight:
    assert record["rollout/logp_abs_diff_max"] < 1e-4  # masked log-probs agree
    assert record["train/reward_format"] == 1.0  # every constrained program parses
    # 2 prompts × 4 rollouts × 6 choice tokens (3 × dir, dist); the KL window is the last 3.
    assert record["recoverfly/action_tokens"] == 48.0
    assert record["recoverfly/kl_window_tokens"] == 24.0
  assert straight[0]["failure/replayed"] == 0.0
  run(tmp_path / "resumed", steps=1)
  resumed, again = run(tmp_path / "resumed")
  assert [r["step"] for r in again] == [1, 2]
  keys = ("train/loss", "train/reward_correct", "train/grad_norm", "train/kl_loss",
          "failure/buffer_size", "failure/replayed")
  for a, b in zip(again, straight, strict=True):
    for key in keys:
      assert same_logged(a[key], b[key]), (a["step"], key, a[key], b[key])
  for key, value in method.parts["recoverfly"].array_state().items():
    np.testing.assert_array_equal(resumed.parts["recoverfly"].array_state()[key], value, key)


def test_config_variants_and_errors():
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 15 and {kw["seed"] for kw in added} == {0, 1, 2}
  grpo = CONFIG.get_config("variant=grpo")
  assert grpo.loss.beta == 0.0 and grpo.recoverfly.rho_fail == 0.0
  assert grpo.recoverfly.switch_step > grpo.steps  # stage 1 throughout
  full = CONFIG.get_config("variant=all")
  assert full.loss.beta > 0 and full.recoverfly.rho_fail > 0
  assert full.recoverfly.switch_step <= full.steps
  assert CONFIG.get_config("runlocal,sft").task == "aerial_nav"
  with pytest.raises(ValueError, match="variant"):
    CONFIG.get_config("variant=other")
  config = CONFIG.get_config("runlocal")
  config.loss.name = "grpo"
  with pytest.raises(ValueError, match="config.loss.name"):
    RecoverFly(config)
