"""Progressive LP → FFT → RFT on the one loop (configs/progressive_recsys.py, runlocal): config
variants and errors; pretrain, then RFT from its workdir, stopped and resumed, repeats the
uninterrupted run; a large β keeps the policy at the reference (KL → 0). The whole phase chain
runs in scripts/progressive_recsys_grid.py."""

from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from runlocal_helpers import same_logged

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import progressive_recsys as prs
from jaxrl_post.models.recommender import RecommenderFM
from jaxrl_post.training import loop, phases
from jaxrl_post.training.metrics import read_metrics
from jaxrl_post.training.train_state import create_train_state, make_train_step

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "progressive_recsys.py")


def _config(phase, init_from="", **overrides):
  config = CONFIG.get_config(f"runlocal,phase={phase}")
  config.metric_writers = "jsonl"
  config.init_from = str(init_from)
  config.optimizer.decay_steps = 100  # the same schedule however many steps a run is given
  config.checkpoint_every = config.eval_every = 0  # the last step only (faster)
  config.update(overrides)
  return config


def _train(config, workdir):
  method = prs.ProgressiveRecsys(config)
  loop.train(config, workdir, method)
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def test_config_variants_sweep_and_errors(tmp_path):
  config = CONFIG.get_config("")
  assert (config.phase, config.steps, config.phases.fft.backbone) == ("pretrain", 400, 0.1)
  assert CONFIG.get_config("phase=sft1").steps == config.lp_steps + config.fft_steps
  rft = CONFIG.get_config("phase=rft,beta=1.0")
  assert (rft.rft.beta, rft.phases.rft.reward, rft.rft.candidates) == (1.0, 0.0, 32)
  rft.rft_steps = 7
  assert rft.steps == 7
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 15 and added[:3] == [
    dict(seed=0, phase="pretrain"), dict(seed=0, phase="sft1", start="pretrain"),
    dict(seed=0, phase="lp", start="pretrain")]
  with pytest.raises(ValueError, match="unknown phase 'ppo'"):
    CONFIG.get_config("phase=ppo")
  with pytest.raises(ValueError, match="config.init_from: phase 'fft' starts from the 'lp'"):
    prs.ProgressiveRecsys(_config("fft"))
  bad = _config("pretrain")
  bad.phases.pretrain = dict(backbone=0.0, heads=0.0)
  with pytest.raises(ValueError, match="config.phases.pretrain=.*freezes every parameter"):
    loop.train(bad, tmp_path / "bad", prs.ProgressiveRecsys(bad))
  bad.phases.pretrain = dict(backbone=1.0, head=1.0)
  with pytest.raises(ValueError, match=r"config.phases.pretrain: unknown parameter group"):
    loop.train(bad, tmp_path / "bad", prs.ProgressiveRecsys(bad))


def test_pretrain_then_rft_stop_and_resume_repeats_the_straight_run(tmp_path):
  pre = _train(_config("pretrain"), tmp_path / "pretrain")
  assert len(pre) == 2 and "train/next_item_nll" in pre[0]
  evals = [r for r in read_metrics(tmp_path / "pretrain") if "eval/rank_ndcg" in r]
  assert 0 <= evals[-1]["eval/rank_ndcg"] <= 1 and "eval/rm/funnel_ndcg" in evals[-1]
  assert (tmp_path / "pretrain" / "final.json").exists()
  # RFT (from pretrain here, to keep the test short; the SFT phases' losses and freezing are
  # tests/training/test_phases.py's): straight, then stopped after 1 step and resumed.
  start = tmp_path / "pretrain"
  straight = _train(_config("rft", start), tmp_path / "straight")
  assert len(straight) == 2 and straight[0]["reward/mean"] > 0
  _train(_config("rft", start, rft_steps=1), tmp_path / "resumed")
  resumed = _train(_config("rft", start), tmp_path / "resumed")
  keys = ("train/loss", "train/kl", "train/pg_loss", "reward/mean", "train/grad_norm")
  assert [r["step"] for r in resumed] == [1, 2]
  for a, b in zip(resumed, straight, strict=True):
    for key in keys:
      assert same_logged(a[key], b[key]), (a["step"], key, a[key], b[key])
  last = [r for r in read_metrics(tmp_path / "resumed") if "eval/rank_ndcg" in r][-1]
  want = [r for r in read_metrics(tmp_path / "straight") if "eval/rank_ndcg" in r][-1]
  assert last["eval/funnel_ndcg"] == want["eval/funnel_ndcg"]


def test_large_beta_keeps_the_policy_at_the_reference():
  config = _config("rft")
  world = prs.build_world(config)
  model = RecommenderFM(world.num_items, dim=16, rngs=nnx.Rngs(0))
  graphdef = nnx.graphdef(model)
  rules = phases.GROUP_RULES.get("recommender")
  tx = phases.phase_optimizer(dict(config.phases.rft), lambda p: phases.group_labels(p, rules),
                              lambda m: optax.adam(1e-2 * m), groups=prs.GROUPS)
  rollout = prs.make_rft_rollout(graphdef, candidates=8, group_size=4, temperature=1.0,
                                 adv_eps=1e-6)
  history = jnp.asarray(world.histories[world.train_users[:8]])

  def final_kl(beta):
    state = create_train_state(model, tx, jax.random.key(0))
    reference = jax.tree.map(jnp.copy, state.params)
    step = make_train_step(graphdef, prs.make_rft_loss(temperature=1.0, epsilon=0.2,
                                                       beta=beta), tx)
    for i in range(6):
      batch = rollout(state.params, reference, history, jax.random.key(i))
      batch.pop("reward")
      state, metrics = step(state, batch)
    batch = rollout(state.params, reference, history, jax.random.key(99))
    batch.pop("reward")
    return float(step(state, batch)[1]["kl"])  # the KL before that update

  free, held = final_kl(0.0), final_kl(100.0)
  assert free > 1e-2
  assert held < 0.05 * free, (free, held)
