"""GRPO with its sampler in a process of its own (`config.rollout.sampler_process`): the same
run as the in-process producer, bitwise; a sampler process's failure reaches the trainer."""

from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest
from runlocal_helpers import train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import group_source
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.models import get_model_config
from jaxrl_post.sampling.sampler_process import SamplerProcess
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_format", "rollout/logp_abs_diff_max",
            "rollout/completion_length_mean", "rollout/staleness_max")


def _config(init, **rollout):
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  config.unlock()
  config.update(dict(eval_every=100, init_from=str(init), steps=3, prompts_per_step=4,
                     log_every=1))
  config.rollout = ml_collections.ConfigDict(dict(mode="one_step_off", **rollout))
  return config


@pytest.mark.slow  # two runs and a second JAX process (≈ 40 s)
def test_sampler_process_gives_the_in_process_run(tmp_path, format_writer_policy):
  here = _config(format_writer_policy)
  loop.train(here, tmp_path / "here", GRPO(here))
  apart = _config(format_writer_policy, sampler_process=True)
  method = GRPO(apart)
  loop.train(apart, tmp_path / "apart", method)
  ours, theirs = train_records(tmp_path / "here"), train_records(tmp_path / "apart")
  assert max(r["train/grad_norm"] for r in ours) > 1e-3  # a real signal is compared
  assert [r["rollout/staleness_max"] for r in theirs] == [0, 1, 1]
  for a, b in zip(ours, theirs, strict=True):
    assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
    assert b["time/weight_sync"] > 0 and b["sync/mb"] > 0
  assert method.source.remote is None  # closed with the run


def test_a_sampler_process_failure_reaches_the_trainer():
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  model_config = get_model_config("tiny", vocab_size=64)
  remote = SamplerProcess(config, model_config, keep_versions=2, timeout_s=300)
  try:
    assert remote.info["devices"] >= 1
    remote.publish({"w": np.zeros((3,), np.float32)}, version=0)  # not the model's arrays
    with pytest.raises(RuntimeError, match=r"(?s)failed while generating.*do not fit"):
      remote.generate(0, ["1+1="], jax.random.key(0))
    for version in (1, 2, 3):
      remote.publish({"w": np.zeros((3,), np.float32)}, version=version)
    with pytest.raises(RuntimeError, match=r"(?s)version 1 was evicted.*\[2, 3\]"):
      remote.generate(1, ["1+1="], jax.random.key(0))
  finally:
    remote.close()
  assert not remote._process.is_alive()
  assert group_source.ROW_KEYS  # the rows a sampler process returns
