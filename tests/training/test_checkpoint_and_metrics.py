"""Checkpointer round trips, the resume policy, and the metric writer."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import save_hf
from jaxrl_post.parallel.mesh import make_placement, mesh_config
from jaxrl_post.training.checkpoint import Checkpointer, resolve_start
from jaxrl_post.training.metrics import MetricWriter, read_metrics
from jaxrl_post.training.train_state import create_train_state


def _state(value=1.0):
  return {"params": {"w": jnp.full((3, 2), value), "b": jnp.zeros((2,))},
          "step": jnp.int32(int(value)), "rng": jax.random.key_data(jax.random.key(7))}


def test_save_restore_round_trip_keeps_n(tmp_path):
  ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), extra={"data": {"position": step * 10}})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3]
  state, extra = ckpt.restore(None, jax.eval_shape(_state))
  np.testing.assert_array_equal(state["params"]["w"], np.full((3, 2), 3.0))
  assert int(state["step"]) == 3 and extra == {"data": {"position": 30}}
  state, extra = ckpt.restore(2, _state())
  assert int(state["step"]) == 2 and extra["data"]["position"] == 20
  ckpt.close()


def test_method_arrays_round_trip_exactly_and_name_a_shape_change(tmp_path):
  ckpt = Checkpointer(tmp_path / "checkpoints")
  arrays = {"replay": {"tokens": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
                       "logp": np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)},
            "count": np.int64(5), "bandit": [np.eye(3), np.ones(3)]}
  ckpt.save(1, _state(), arrays=arrays)
  ckpt.save(2, _state())  # a step without method arrays
  ckpt.wait()
  like = jax.tree.map(np.zeros_like, arrays)
  got = ckpt.restore_arrays(1, like)
  assert jax.tree.structure(got) == jax.tree.structure(arrays)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(arrays), strict=True):
    assert isinstance(a, np.ndarray) and a.dtype == np.asarray(b).dtype
    np.testing.assert_array_equal(a, b)
  assert ckpt.restore_arrays(2, like) is None
  bigger = dict(like, replay=dict(like["replay"], tokens=np.zeros((4, 3, 4), np.int32)))
  with pytest.raises(ValueError, match=r"\['replay'\]\['tokens'\].*\(2, 3, 4\)"):
    ckpt.restore_arrays(1, bigger)


def test_restore_into_a_sharded_train_state_keeps_its_shardings(tmp_path):
  placement = make_placement(mesh_config(ici=dict(data=2, fsdp=2, tensor=2)))
  model = CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0))
  state = create_train_state(model, optax.adam(1e-3), jax.random.key(0),
                             mesh=placement.train_mesh, rules=placement.train_rules)
  ckpt = Checkpointer(tmp_path / "checkpoints")
  ckpt.save(1, state)
  ckpt.wait()
  restored, _ = ckpt.restore(1, state)
  ckpt.close()
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    assert b.sharding == a.sharding
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  q = restored.params["layers"][0]["attn"]["q_proj"].get_value()
  assert tuple(q.sharding.spec)[:2] == ("fsdp", "tensor")


def test_unfinished_save_is_never_the_latest(tmp_path):
  ckpt = Checkpointer(tmp_path / "checkpoints")
  ckpt.save(1, _state(1))
  ckpt.close()
  # What a kill during an async save leaves: orbax's temporary directory.
  (tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1234").mkdir()
  assert resolve_start(tmp_path / "checkpoints").step == 1
  assert Checkpointer(tmp_path / "checkpoints").latest_step() == 1


def test_resume_policy_order(tmp_path):
  own, other = tmp_path / "run" / "checkpoints", tmp_path / "other"
  assert resolve_start(own).kind == "scratch"
  ckpt = Checkpointer(other / "checkpoints")
  ckpt.save(5, _state(5))
  ckpt.close()
  hf_dir = tmp_path / "hf"
  save_hf(CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0)), hf_dir)
  assert resolve_start(own, init_from=str(hf_dir)).kind == "init_from_hf"
  start = resolve_start(own, init_from=str(other))
  assert (start.kind, start.step) == ("init_from_checkpoint", 5)
  start = resolve_start(own, resume=str(other), init_from=str(hf_dir))
  assert (start.kind, start.step) == ("resume", 5)
  ckpt = Checkpointer(own)
  ckpt.save(9, _state(9))
  ckpt.close()
  start = resolve_start(own, resume=str(other), init_from=str(hf_dir))
  assert (start.kind, start.step) == ("workdir", 9)  # pre-emption wins over everything
  with pytest.raises(FileNotFoundError, match="config.resume='/nope'"):
    resolve_start(tmp_path / "fresh", resume="/nope")
  with pytest.raises(FileNotFoundError, match="config.init_from='/nope'"):
    resolve_start(tmp_path / "fresh", init_from="/nope")


def test_metric_writer_jsonl_tensorboard_and_resume(tmp_path):
  writer = MetricWriter(tmp_path)
  writer.write_config({"lr": 0.1, "model": "tiny"})
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step, "reward": np.float32(step), "bad": float("nan")})
  writer.close()
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
  assert records[1]["loss"] == 0.5 and records[0]["bad"] == "nan"
  assert json.loads((tmp_path / "config.json").read_text())["lr"] == 0.1
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  # Resumed from the checkpoint of step 3: records after it are dropped, so the
  # file matches an uninterrupted run once steps 4-5 are written again.
  writer = MetricWriter(tmp_path, resume_step=3)
  writer.write(4, {"loss": 0.25})
  writer.close()
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_init_from_reads_parameters_only_whatever_the_optimizer(tmp_path):
  # An SFT checkpoint written with AdamW initialises a run that uses SGD with momentum:
  # the optimizer states differ in structure, the parameters must still come back exactly.
  import ml_collections

  from jaxrl_post.training import base_configs
  from jaxrl_post.training import setup as run_setup
  from jaxrl_post.training.checkpoint import StartPoint
  from jaxrl_post.training.train_state import create_train_state

  def state_with(name, seed):
    config = ml_collections.ConfigDict()
    config.optimizer = base_configs.optimizer_config(lr=1e-3, name=name, momentum=0.9)
    model = CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(seed))
    return create_train_state(model, run_setup.build_optimizer(config, 10), jax.random.key(0))

  saved = state_with("adamw", seed=1)
  ckpt = Checkpointer(tmp_path / "sft" / "checkpoints")
  ckpt.save(3, saved)
  ckpt.close()
  fresh = state_with("sgd", seed=2)
  start = StartPoint("init_from_checkpoint", tmp_path / "sft" / "checkpoints", 3)
  restored, extra = run_setup.restore(start, Checkpointer(tmp_path / "unused"), fresh)
  assert extra == {}
  assert jax.tree.structure(restored.opt_state) == jax.tree.structure(fresh.opt_state)
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(restored.params),
                               jax.tree.leaves(saved.params)):
    np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(path))
  assert not np.array_equal(jax.tree.leaves(fresh.params)[0], jax.tree.leaves(saved.params)[0])


def test_eval_outcomes_round_trip_with_missing_values(tmp_path):
  from jaxrl_post.training.metrics import read_eval_outcomes, write_eval_outcomes

  write_eval_outcomes(tmp_path, 10, greedy_correct=np.array([1.0, np.nan]),
                      sample_correct=np.array([[1.0, 0.0], [np.nan, 1.0]]))
  write_eval_outcomes(tmp_path, 0, greedy_correct=np.array([0.0, 1.0]),
                      sample_correct=np.zeros((2, 0)))
  write_eval_outcomes(tmp_path, 10, greedy_correct=np.array([1.0, 0.0]),  # resumed: rewritten
                      sample_correct=np.array([[1.0, 0.0], [np.nan, 1.0]]))
  outcomes = read_eval_outcomes(tmp_path)
  assert sorted(outcomes) == [0, 10]
  np.testing.assert_array_equal(outcomes[10]["greedy_correct"], [1.0, 0.0])
  np.testing.assert_array_equal(outcomes[10]["sample_correct"], [[1.0, 0.0], [np.nan, 1.0]])
  assert outcomes[0]["sample_correct"].shape == (2, 0)
  assert not list(tmp_path.glob("eval_outcomes/*.tmp"))
