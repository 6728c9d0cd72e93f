"""RAIL on the one loop (configs/rail.py, runlocal): the bandit decides per group, extra rollouts
are sampled into a fixed block of rows, the bandit learns from every decision, and a
stopped-and-resumed run repeats the uninterrupted one (bandit, switch and rollout counts are in
the checkpoint's method arrays)."""

import math
from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import same_logged, train_grpo, train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import interventions

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "rail.py")


def _config(arg="runlocal", **overrides):
  config = CONFIG.get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def test_rail_intervenes_learns_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = train_records(tmp_path / "straight")
  assert len(records) == 4
  config = _config()
  part = straight.parts["intervention"]
  b, g = config.prompts_per_step, config.group_size
  # One bandit update per group and step; every rollout (fresh and extra) is counted.
  assert int(part.bandit.count) == 4 * b
  extra = [r["rail/extra_rows"] for r in records]
  assert part.spent.sum() == 4 * b * g + sum(extra)
  assert all(0 <= e <= part.extra_rows for e in extra) and sum(extra) > 0
  assert all(r["rail/interventions"] <= config.intervention.max_groups for r in records)
  assert int(part.switch.decisions) == 4 * b

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = train_records(tmp_path / "resumed")
  state = part.array_state()
  for key in ("bandit", "switch"):
    for name, value in state[key].items():
      np.testing.assert_array_equal(resumed.parts["intervention"].array_state()[key][name],
                                    value, err_msg=f"{key}.{name}")
  np.testing.assert_array_equal(resumed.parts["intervention"].spent, part.spent)
  keys = ("train/loss", "train/reward_correct", "rail/interventions", "rail/extra_rows",
          "rail/extra_tokens", "rail/gain", "rail/utility", "rail/mixed_after",
          "rail/random_share")
  assert [r["step"] for r in again] == [r["step"] for r in records]
  for a, b_ in zip(again, records, strict=True):
    for key in keys:
      assert same_logged(a[key], b_[key]), (a["step"], key, a[key], b_[key])


@pytest.mark.parametrize("overrides, match", [
  ({"intervention.mode": "bogus"}, "config.intervention.mode='bogus'"),
  ({"intervention.bandit": "ucb1"}, "config.intervention.bandit='ucb1'"),
  ({"intervention.gain": "reward"}, "config.intervention.gain='reward'"),
  ({"intervention.max_groups": 0}, "config.intervention.max_groups must be >= 1"),
  ({"intervention.extra_rollouts": ()}, "config.intervention.extra_rollouts"),
  ({"intervention.extra_rollouts": (0,)}, "config.intervention.extra_rollouts"),
  ({"intervention.temperatures": (-1.0,)}, "config.intervention.extra_rollouts / temperatures"),
  ({"intervention.epsilon": 1.5}, "config.intervention.epsilon"),
  ({"intervention.gamma": 0.0}, "config.intervention.gamma"),
  ({"intervention.extra_rollouts": (2, 3)}, "config.ppo_mini_batches"),  # 8 + 2·3 rows
  ({"loss.beta": 0.04}, "config.loss.beta = 0"),
  ({"rubric.mode": "care"}, "config.rubric.mode = 'none'"),
  ({"intervention.switch": "window"}, "config.intervention.switch='window'"),
  ({"intervention.min_share": 0.0}, "config.intervention.min_share"),
])
def test_rail_config_errors_name_the_key(overrides, match):
  config = _config()
  for key, value in overrides.items():
    section, name = key.split(".")
    if section not in config:
      config[section] = {}
    config[section][name] = value
  with pytest.raises(ValueError, match=match):
    interventions.build_interventions(config)


def test_config_variants_and_sweep_build():
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 9 and {kw["seed"] for kw in added} == {0, 1, 2}
  for arg in ("", "runlocal", "bandit=lints,gain=variance", "mode=heuristic"):
    part = interventions.build_interventions(_config(arg))
    assert part.extra_rows == (8 if "runlocal" in arg else 32)
    # "none" and restart × m × T (no branch arms on a single-turn host).
    assert len(part.arms) == (1 + 2 * 2 if "runlocal" in arg else 1 + 3 * 3)
  assert interventions.build_interventions(_config("mode=none")) is None
  share = interventions.build_interventions(_config("switch=share,alpha=0.1"))
  assert share.switch_rule == "share" and share.knobs.alpha == 0.1
  assert share.switch.recent.shape == (50,) and not bool(share.switch.live)
  assert bool(interventions.build_interventions(_config("switch=live")).switch.live)
  # task=quickstart: the quickstart's task and recipe; 8 of 32 groups × m = 8 extra rows, which
  # with the 256 fresh ones split into its 4 PPO mini-batches.
  quick = _config("task=quickstart,mode=heuristic")
  assert quick.task_knobs.max_digits == 2 and quick.optimizer.lr == 2e-5
  assert interventions.build_interventions(quick).extra_rows == 64
  with pytest.raises(ValueError, match="task='bogus'"):
    CONFIG.get_config("task=bogus")
  with pytest.raises(ValueError, match="switch='bogus'"):
    CONFIG.get_config("switch=bogus")
  assert "rail/extra_tokens" in CONFIG.metrics()
  with pytest.raises(ValueError, match="mode='bogus'"):
    CONFIG.get_config("mode=bogus")


def test_rail_scores_the_extra_rows_with_the_overlong_column(tmp_path, format_writer_policy):
  # DAPO's length penalty as a third reward column: the enlarged groups' extra rows get it
  # from their own lengths (window 4..8 tokens of the runlocal max_new_tokens).
  config = _config(init_from=str(format_writer_policy), steps=2)
  config.reward_weights = dict(correct=1.0, format=0.1, overlong=1.0)
  config.overlong = dict(max_len=config.max_new_tokens, cache_len=config.max_new_tokens // 2)
  method = train_grpo(config, tmp_path / "overlong")
  records = train_records(tmp_path / "overlong")
  assert [r["step"] for r in records] == [1, 2]
  assert sum(r["rail/extra_rows"] for r in records) > 0
  assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["rail/gain"]) for r in records)
  assert int(method.parts["intervention"].bandit.count) == 2 * config.prompts_per_step


def test_live_switch_acts_from_the_first_step_and_old_checkpoints_load(tmp_path,
                                                                      format_writer_policy):
  # switch=live: the bandit picks every executed arm (no heuristic, no random arms); the
  # share rule's record is still kept and logged.
  method = train_grpo(_config("runlocal,switch=live", init_from=str(format_writer_policy), steps=2),
                  tmp_path / "live")
  records = train_records(tmp_path / "live")
  assert [r["rail/controller_share"] for r in records] == [1.0, 1.0]
  assert all(r["rail/live"] == 1.0 and r["rail/random_share"] == 0.0 for r in records)
  part = method.parts["intervention"]
  assert 0.0 <= records[-1]["rail/window_share"] <= 1.0
  # A checkpoint from before the share rule (switch without `recent` / `counted`) restores
  # with an empty record.
  arrays = part.array_state()
  old = dict(arrays, switch={k: arrays["switch"][k] for k in ("live", "streak", "decisions")})
  fresh = interventions.build_interventions(_config("runlocal"))
  fresh.load_array_state(old)
  assert int(fresh.switch.decisions) == int(part.switch.decisions)
  assert int(fresh.switch.counted) == 0 and fresh.switch.recent.shape == (2,)
