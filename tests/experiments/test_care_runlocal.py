"""CARE on the one loop (configs/care.py, runlocal): the step trains on rubric rewards, the rubrics
of the drawn prompts evolve (and stay within the cap), the static baseline never changes its
rubric, and a stopped-and-resumed run repeats the uninterrupted one (the rubrics are in the
checkpoint's method arrays)."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import same_logged, train_grpo, train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import rubric_evolution
from jaxrl_post.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "care.py")


def _config(arg="runlocal", **overrides):
  config = CONFIG.get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def test_care_evolves_rubrics_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = train_records(tmp_path / "straight")
  assert len(records) == 4
  part = straight.parts["rubric"]
  sizes = (part.state.ids >= 0).sum(axis=1)
  # The format writer never shows worked steps: the anchor (the demonstration) is ahead and
  # preferred on every prompt, so CARE chases and the rubrics grow, up to the cap of 4.
  assert sum(r["care/added"] for r in records) >= 1
  assert sizes.max() > 2 and sizes.max() <= 4
  assert all(r["care/rubric_reward"] <= 1.0 for r in records)
  assert all(r["care/adaptive"] + r["care/chase"] <= 2 for r in records)

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = train_records(tmp_path / "resumed")
  for name, value in part.array_state().items():
    np.testing.assert_array_equal(resumed.parts["rubric"].array_state()[name], value,
                                  err_msg=name)
  keys = ("train/loss", "train/reward_correct", "care/true_accuracy", "care/rubric_reward",
          "care/adaptive", "care/chase", "care/added", "care/rubric_size",
          "care/pool_rubric_size")
  assert [r["step"] for r in again] == [r["step"] for r in records]
  for a, b in zip(again, records, strict=True):
    for key in keys:
      assert same_logged(a[key], b[key]), (a["step"], key, a[key], b[key])


def test_static_baseline_keeps_its_rubric(tmp_path, format_writer_policy):
  method = train_grpo(_config("runlocal,mode=static", init_from=str(format_writer_policy), steps=2),
                  tmp_path / "static")
  records = train_records(tmp_path / "static")
  assert [r["care/added"] for r in records] == [0.0, 0.0]
  ids = method.parts["rubric"].state.ids
  np.testing.assert_array_equal(ids, np.tile([0, 1, -1, -1], (len(ids), 1)))


@pytest.mark.parametrize("overrides, match", [
  ({"rubric.mode": "bogus"}, "config.rubric.mode='bogus'"),
  ({"rubric.library": "prose"}, "config.rubric.library='prose'"),
  ({"rubric.initial": "final_line,nonsense"}, "config.rubric.initial"),
  ({"rubric.initial": "exact,exact"}, "config.rubric.initial"),
  ({"rubric.max_criteria": 1}, "config.rubric.max_criteria=1"),
])
def test_care_config_errors_name_the_key(overrides, match):
  config = _config()
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(ValueError, match=match):
    rubric_evolution.build_rubric_evolution(config, get_task(config.task,
                                                             **dict(config.task_knobs)))


def test_config_variants_and_sweep_build():
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 6 and {kw["seed"] for kw in added} == {0, 1, 2}
  task = get_task("arith")
  for arg in ("", "runlocal", "initial=final_line+exact,max_criteria=3"):
    config = _config(arg)
    part = rubric_evolution.build_rubric_evolution(config, task)
    assert part.max_criteria == (3 if "max_criteria" in arg else 4)
  assert "care/true_accuracy" in CONFIG.metrics()
  with pytest.raises(ValueError, match="mode='bogus'"):
    CONFIG.get_config("mode=bogus")
