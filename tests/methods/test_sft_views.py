"""methods/sft_views.py: SFT rows shown with an ICE instruction or a ReflectRL golden negative."""

import doctest
from pathlib import Path

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import ice, reflect_rl, sft_views
from jaxrl_post.methods.sft import SFT
from jaxrl_post.tasks.arithmetic import ArithmeticTask
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE = "{prompt}Wrong:\n{negative}\nFix:\n"
HINTS = ("Hint: a.", "Hint: b.")


def _views(hint=1 / 3, reflect=1 / 3, hints=HINTS, template=TEMPLATE):
  return ConfigDict(dict(hint_frac=hint, hints=hints, reflect_frac=reflect,
                         reflect_template=template, reflect_slip="random"))


def test_doctests():
  assert doctest.testmod(sft_views, raise_on_error=True).attempted >= 3


def test_each_view_has_its_prompt_and_the_exact_solution():
  task = ArithmeticTask(max_digits=2, operations="+-", demo_slip=0.5)
  records = [task.make_example("train", i) for i in range(600)]
  prompts, demos, which = sft_views.apply_views(records, task, _views(), seed=3, step=7)
  shares = np.bincount(which, minlength=3) / len(which)
  # Hint 1/3; reflect 1/3 of the rows but only where a golden negative exists (then bare).
  assert abs(shares[1] - 1 / 3) < 0.06 and 0.05 < shares[2] < 1 / 3 + 0.06
  has_negative = np.array([task.golden_negative(r) is not None for r in records])
  assert has_negative[which == 2].all()
  negatives = reflect_rl.TaskNegatives(task, slip="random", seed=3)
  slipped_bare = 0
  for record, prompt, demo, view in zip(records, prompts, demos, which, strict=True):
    exact = task.exact_demonstration(record)
    if view == 0:  # bare: the task's own (sloppy) demonstration
      assert (prompt, demo) == (record["prompt"], record["demonstration"])
      slipped_bare += demo != exact
    elif view == 1:
      assert prompt in {ice.conditioned_prompt(record["prompt"], h) for h in HINTS}
      assert demo == exact
    else:
      assert prompt == reflect_rl.reflective_prompt(TEMPLATE, record["prompt"],
                                                    negatives(record))
      assert demo == exact and task.reward(record, negatives(record)).correct == 0.0
    assert task.reward(record, exact).correct == 1.0
  assert slipped_bare > 20  # the bare rows keep the sloppy teacher's slips
  # Both hints are used; the draw is a function of (seed, step, row) only.
  assert {p.split("\n")[0] for p, v in zip(prompts, which, strict=True) if v == 1} == set(HINTS)
  again = sft_views.apply_views(records, task, _views(), seed=3, step=7)
  assert again[0] == prompts and again[1] == demos
  other = sft_views.apply_views(records, task, _views(), seed=3, step=8)
  assert other[0] != prompts


def test_bad_views_name_the_key():
  task = ArithmeticTask()
  config = ConfigDict(dict(sft_views=_views(hint=0.7, reflect=0.5)))
  with pytest.raises(ValueError, match="hint_frac \\+ reflect_frac"):
    sft_views.validate_views(config, task)
  config.sft_views = _views(hint=-0.1)
  with pytest.raises(ValueError, match="config.sft_views.hint_frac=-0.1"):
    sft_views.validate_views(config, task)
  config.sft_views = _views(hints=())
  with pytest.raises(ValueError, match="needs non-empty config.sft_views.hints"):
    sft_views.validate_views(config, task)
  config.sft_views = _views(template="{prompt} only")
  with pytest.raises(ValueError, match="config.reflect.template"):
    sft_views.validate_views(config, task)

  class NoExact:
    name = "plain"

  config.sft_views = _views(reflect=0.0)
  with pytest.raises(ValueError, match="task 'plain' has no exact_demonstration"):
    sft_views.validate_views(config, NoExact())
  config.sft_views = _views(hint=0.0, reflect=0.0)
  assert not sft_views.active(config)
  with pytest.raises(ValueError, match="views='all'"):
    load_module(ROOT / "configs" / "sft_arith.py").get_config("views=all")


def test_sft_run_with_both_views_logs_their_shares(tmp_path):
  config = load_module(ROOT / "configs" / "sft_arith.py").get_config(
    "runlocal,views=both,slip=0.3")
  config.update(dict(steps=2, checkpoint_every=2, eval_every=100, eval_examples=2,
                     eval_max_new_tokens=4, compilation_cache_dir=""))
  loop.train(config, tmp_path, SFT(config))
  train = [r for r in read_metrics(tmp_path) if "train/nll" in r]
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    shares = [r[f"sft/{v}_frac"] for v in sft_views.VIEWS]
    assert abs(sum(shares) - 1.0) < 1e-6 and np.isfinite(r["train/nll"])
  assert sum(r["sft/hint_frac"] + r["sft/reflect_frac"] for r in train) > 0
