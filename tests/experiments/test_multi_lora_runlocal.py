"""Multi-LoRA (runlocal): two tenants train their own adapters on one frozen base; a tenant
follows a single-LoRA run of its own config bitwise; a restart continues exactly; each
tenant's adapters export merged."""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.methods.multi_lora import MultiLoRA, tenant_records
from jaxrl_post.models import without_lora
from jaxrl_post.models.lora import merge_adapters
from jaxrl_post.training import loop
from jaxrl_post.training.export import export_run
from jaxrl_post.training.metrics import read_metrics
from jaxrl_post.training.run_dir import load_run

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_format", "rollout/logp_abs_diff_max")


def _config(init):
  config = load_module(ROOT / "configs" / "multi_lora.py").get_config("runlocal")
  config.unlock()
  config.update(dict(init_from=str(init), steps=2, checkpoint_every=1, log_every=1,
                     eval_every=2, eval_at_start=False, metric_writers="jsonl",
                     prompts_per_step=4))
  config.lora.update(dict(rank=4, alpha=8.0))
  config.optimizer.lr = 1e-2  # adapters start at b = 0: a visible move in two steps
  return config


def _b_leaves(params):
  return [np.asarray(x) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
          if "_lora_b" in jax.tree_util.keystr(path)]


def test_tenants_train_apart_match_single_runs_resume_and_export(tmp_path,
                                                                 format_writer_policy):
  config = _config(format_writer_policy)
  method = MultiLoRA(config)
  state = loop.train(config, tmp_path / "multi", method)
  records = [r for r in read_metrics(tmp_path / "multi") if "train/plus/loss" in r]
  assert [r["step"] for r in records] == [1, 2]
  evals = [r for r in read_metrics(tmp_path / "multi") if "eval/minus/accuracy" in r]
  assert [r["step"] for r in evals] == [2] and "eval/plus/accuracy" in evals[0]
  assert (tmp_path / "multi" / "tenants" / "plus" / "eval_outcomes").is_dir()
  # Each tenant moved its own adapters away from b = 0, to different places.
  plus, minus = _b_leaves(state.params["plus"]), _b_leaves(state.params["minus"])
  assert any(np.any(x) for x in plus) and any(np.any(x) for x in minus)
  assert not all(np.array_equal(x, y) for x, y in zip(plus, minus))
  # One base for both: the tenants' runs hold the very same frozen arrays.
  runs = method.tenant_runs
  assert all(a is b for a, b in zip(jax.tree.leaves(runs["plus"].frozen),
                                    jax.tree.leaves(runs["minus"].frozen)))

  # Tenant `minus` is exactly a single-LoRA run of its own config.
  single = method.configs["minus"].copy_and_resolve_references()
  single.unlock()
  del single["multi_lora"]
  alone = loop.train(single, tmp_path / "alone", GRPO(single))
  theirs = [r for r in read_metrics(tmp_path / "alone") if "train/loss" in r]
  ours = tenant_records(records, "minus")
  for a, b in zip(ours, theirs, strict=True):
    assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
  for x, y in zip(jax.tree.leaves(state.params["minus"]), jax.tree.leaves(alone.params)):
    np.testing.assert_array_equal(x, y)

  # A restart from checkpoint 1 (the later one removed) continues every tenant exactly.
  resumed = tmp_path / "resumed"
  shutil.copytree(tmp_path / "multi", resumed)
  shutil.rmtree(resumed / "checkpoints" / "2")
  again = loop.train(config, resumed, MultiLoRA(config))
  again_records = [r for r in read_metrics(resumed) if "train/plus/loss" in r]
  for name in ("plus", "minus"):
    for a, b in zip(tenant_records(records, name), tenant_records(again_records, name),
                    strict=True):
      assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(x, y)

  # Export: a tenant's adapters merged into the base; the run needs `adapter` to choose one.
  with pytest.raises(ValueError, match=r"multi-LoRA run.*tenants: minus, plus"):
    load_run(tmp_path / "multi")
  with pytest.raises(ValueError, match=r"not a multi-LoRA run"):
    load_run(tmp_path / "alone", adapter="plus")
  loaded = load_run(tmp_path / "multi", adapter="minus")
  merged = without_lora(method.tenants["minus"].model)
  nnx.update(merged, merge_adapters(state.params["minus"], runs["minus"].frozen))
  ids = jnp.asarray(np.arange(12).reshape(2, 6) + 3, jnp.int32)
  np.testing.assert_allclose(loaded.model(ids), merged(ids), rtol=1e-6, atol=1e-5)
  report = export_run(tmp_path / "multi", tmp_path / "hf_plus", adapter="plus")
  assert report.step == 2 and "model.safetensors" in report.files
