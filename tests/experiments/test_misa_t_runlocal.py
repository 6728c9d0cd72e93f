"""GRPO on the task mixture with MISA-T rollout admission (configs/misa_t.py:runlocal):
trains, reports the admission metrics, and resumes to the same metrics as an unbroken run."""

from pathlib import Path

import pytest
from runlocal_helpers import train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import group_source
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.tasks.base import get_task
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_format", "admission/held_arith1",
            "admission/held_arith3", "admission/forced", "admission/tv_consumed_target",
            "admission/cap_arith1")


def _config(init, **overrides):
  config = load_module(ROOT / "configs" / "misa_t.py").get_config("runlocal")
  config.unlock()
  # Each batch generated on demand with the newest weights (`max_in_flight=0`): a
  # deterministic run through the producer's path, so stop-and-resume can be compared exactly.
  config.rollout.max_in_flight = 0
  config.update(dict(dict(eval_every=100, init_from=str(init), log_every=1), **overrides))
  return config


def test_misa_t_runlocal_trains_and_resumes_exactly(tmp_path, format_writer_policy):
  config = _config(format_writer_policy, steps=3, checkpoint_every=3)
  loop.train(config, tmp_path / "full", GRPO(config))
  full = train_records(tmp_path / "full")
  assert [r["step"] for r in full] == [1, 2, 3]
  assert max(r["train/grad_norm"] for r in full) > 1e-3  # a real signal is compared
  # The 16-block budget binds: sessions are held, and the consumed mixture is tracked.
  assert sum(r["admission/held_arith1"] + r["admission/held_arith3"] for r in full) > 0
  assert all(0.0 <= r["admission/tv_consumed_target"] <= 1.0 for r in full)

  workdir = tmp_path / "resumed"
  config = _config(format_writer_policy, steps=2, checkpoint_every=2)
  loop.train(config, workdir, GRPO(config))
  config = _config(format_writer_policy, steps=3, checkpoint_every=2)
  loop.train(config, workdir, GRPO(config))
  resumed = train_records(workdir)
  assert [r["step"] for r in resumed] == [1, 2, 3]
  for a, b in zip(full, resumed, strict=True):
    assert {k: a[k] for k in COMPARED} == pytest.approx({k: b[k] for k in COMPARED}, abs=0)


def test_admission_needs_a_mixture_and_a_known_policy(format_writer_policy):
  config = _config(format_writer_policy, steps=1)
  config.rollout.admission = "fifo"
  with pytest.raises(ValueError, match="config.rollout.admission='fifo'"):
    GRPO(config)
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  config.unlock()
  config.rollout.admission = "misa_t"
  method = GRPO(config)
  method.task = get_task("arith")
  with pytest.raises(ValueError, match="needs a task with workload classes"):
    group_source.build_scheduler(method, method.rollout_options)


def test_misa_t_caps_the_slots_of_continuous_batching(tmp_path, format_writer_policy):
  config = _config(format_writer_policy, steps=2, checkpoint_every=2)
  config.rollout.num_slots, config.rollout.admit_size = 4, 2
  loop.train(config, tmp_path / "slots", GRPO(config))
  records = train_records(tmp_path / "slots")
  assert [r["step"] for r in records] == [1, 2]
  for r in records:  # each class's share of the 4 slots, at least one slot each
    caps = [r["admission/slot_cap_arith1"], r["admission/slot_cap_arith3"]]
    assert all(1 <= c <= 4 for c in caps), caps
  assert max(r["train/grad_norm"] for r in records) > 1e-3
