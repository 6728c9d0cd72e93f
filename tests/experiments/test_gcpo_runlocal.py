"""GCPO on the one loop (configs/gcpo.py, runlocal): every update of a targeted kernel stays in
the complement of the starting kernel's principal subspaces, the other mixture domains are
evaluated, and a stopped-and-resumed run repeats the uninterrupted one (the bases are in the
optimizer state, so in the checkpoint)."""

from pathlib import Path

import jax
import numpy as np

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg="runlocal", **overrides):
  config = load_module(ROOT / "configs" / "gcpo.py").get_config(arg)
  config.update(dict(eval_every=4, eval_examples=2, **overrides))
  return config


def test_gcpo_updates_stay_out_of_the_principal_block_and_resume(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  config = _config(init_from=init)
  start = {}

  class Recording(GRPO):
    def start(self, run, state):
      start["params"] = jax.tree.map(np.asarray, state.params)
      super().start(run, state)

  final = loop.train(config, tmp_path / "straight", Recording(config))
  records = read_metrics(tmp_path / "straight")
  assert {"eval/countdown/accuracy", "eval/format/accuracy"} <= set(records[-1])
  bases = final.opt_state[-1].bases  # the chain's last stage: the projection
  kernel = ("layers", 1, "mlp", "down_proj")
  w0 = start["params"]
  w1 = final.params
  for key in kernel:
    w0, w1, bases = w0[key], w1[key], bases[key]
  delta = np.asarray(w1.get_value(), np.float64) - np.asarray(w0.get_value(), np.float64)
  bs = bases.get_value()
  assert np.abs(delta).max() > 1e-6  # it trained
  assert np.abs(np.asarray(bs.psi, np.float64).T @ delta).max() < 1e-5 * np.abs(delta).max()
  assert np.abs(delta @ np.asarray(bs.phi, np.float64)).max() < 1e-5 * np.abs(delta).max()

  loop.train(_config(init_from=init, steps=2), tmp_path / "resumed", GRPO(config))
  loop.train(config, tmp_path / "resumed", GRPO(config))
  again = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  want = [r for r in records if "train/loss" in r]
  for key in ("train/loss", "train/grad_norm"):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in want], key
