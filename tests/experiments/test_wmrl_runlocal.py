"""WMRL on the one loop (configs/wmrl.py, runlocal): the world model rewards the non-anchor
groups, the calibrator fits on the anchors' pairs within the run, fewer rows than all use the
real reward, and a stopped-and-resumed run repeats the uninterrupted one (calibrator and IVD
state are in the checkpoint's method arrays)."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import same_logged, train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import world_model
from jaxrl_post.tasks import get_task
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "wmrl.py")


def _config(arg="runlocal", **overrides):
  config = CONFIG.get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def test_wmrl_fits_the_calibrator_saves_env_rows_and_resumes_exactly(tmp_path,
                                                                     format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  assert len(records) == 4
  config = _config()
  rows = config.prompts_per_step * config.group_size
  # One anchor group of two, every step: half the rows' real rewards are used.
  assert [r["wmrl/env_rows"] for r in records] == [config.group_size] * 4
  assert all(r["wmrl/env_rows"] < rows for r in records)
  part = straight.parts["world_model"]
  assert int(part.calibrator.count) == 4 * config.group_size  # every anchor pair pushed
  assert bool(part.calibrator.fitted) and int(part.calibrator.num_fits) >= 1
  assert records[-1]["wmrl/calibrator_fitted"] == 1.0
  assert records[0]["wmrl/calibrator_fitted"] == 1.0  # 4 pairs = min_pairs at step 1

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  for key in ("calibrator", "ivd"):
    for name, value in straight.parts["world_model"].array_state()[key].items():
      np.testing.assert_array_equal(resumed.parts["world_model"].array_state()[key][name],
                                    value, err_msg=f"{key}.{name}")
  keys = ("train/loss", "train/reward_correct", "wmrl/env_rows", "wmrl/ivd_weight",
          "wmrl/calibrator_fitted", "wmrl/pairs", "wmrl/disagreement", "wmrl/rwm_corr",
          "wmrl/reward_mae")
  assert [r["step"] for r in again] == [r["step"] for r in records]
  for a, b in zip(again, records, strict=True):
    for key in keys:
      assert same_logged(a[key], b[key]), (a["step"], key, a[key], b[key])


def test_config_variants_and_sweep_build():
  task = get_task("arith")
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 18 and {kw["seed"] for kw in added} == {0, 1, 2}
  for arg in ("", "runlocal"):
    for kw in added[:6]:
      config = _config(arg)
      for key, value in kw.items():
        if "." in key:
          section, name = key.split(".")
          config[section][name] = value
      part = world_model.build_world_model(config, task)
      assert part.k == {"env": config.prompts_per_step, "raw": 0}.get(
        config.world_model.mode, 2 if arg == "" else 1)
  assert "wmrl/env_rows" in CONFIG.metrics()
  tokenizer = get_tokenizer(config.tokenizer)
  longest = max(len(tokenizer.encode(task.make_example("train", i)["prompt"]))
                for i in range(100))
  assert longest <= config.prompt_len
  with pytest.raises(ValueError, match="mode='bogus'"):
    CONFIG.get_config("mode=bogus")
