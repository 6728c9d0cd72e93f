"""methods/opd_family.py: method names and config errors, teacher vocabulary checks, the
method state's round trip, TV-OPD's skip on a non-finite step, advantage wiring against the pure
functions, and OPRD's transform inside the chunked scorer."""

import doctest
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post import losses
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import grpo, opd_family
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import score_model
from jaxrl_post.training.checkpoint import StartPoint
from jaxrl_post.training.objectives import make_policy_loss

ROOT = Path(__file__).resolve().parents[2]


def _config_module():
  return load_module(ROOT / "configs" / "opd_family.py", "opd_family_config")


def _config(arg="", **distill):
  config = _config_module().get_config(arg)
  config.distill.update(distill)
  return config




def test_doctests():
  result = doctest.testmod(opd_family, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted >= 3 and result.failed == 0


def test_method_names_parse_and_unknown_names_list_the_known_ones():
  names = opd_family.method_names()
  for name in ("grpo", "opd", "tv_opd", "opd_then_rl", "tgopd", "opdvr", "grpd", "oprd",
               "joint:kdrl", "joint:kdrl_mask", "joint:srpo", "joint:hdpo", "joint:trrd",
               "joint:rlsd", "joint:kdrl_annealing"):
    assert name in names
    assert opd_family.parse_method(name).name == name
  assert opd_family.parse_method("joint:KDRL-Annealing").baseline == "kdrl_annealing"
  assert opd_family.parse_method("oprd").needs_teacher_ref
  with pytest.raises(ValueError, match=r"unknown joint OPD baseline 'kdrl2'; known: hdpo, kdrl,"):
    opd_family.parse_method("joint:kdrl2")
  with pytest.raises(ValueError, match=r"'distill' is unknown; known: grpo, opd, tv_opd"):
    opd_family.parse_method("distill")
  # Every row of the config's grid is a valid name.
  assert set(_config_module().METHODS) <= set(names)


def test_config_errors_name_what_is_missing():
  for method in ("opd", "tv_opd", "joint:srpo", "tgopd", "oprd"):
    with pytest.raises(ValueError, match=rf"method='{method}' needs a teacher: set "
                                         r"config.distill.teacher="):
      opd_family.validate_distill(_config(f"method={method}"))
  with pytest.raises(ValueError, match=r"'oprd' needs the teacher's pre-RL reference: set "
                                       r"config.distill.teacher_ref"):
    opd_family.validate_distill(_config("method=oprd", teacher="/t"))
  assert opd_family.validate_distill(_config("method=grpo")).needs_teacher is False
  assert opd_family.validate_distill(_config("method=oprd", teacher="/t", teacher_ref="/r"))
  with pytest.raises(ValueError, match=r"tv_variant='signed' is unknown; known: tv, "
                                       r"group_constant, permuted, raw, sign"):
    opd_family.validate_distill(_config("method=tv_opd,tv_variant=signed", teacher="/t"))
  with pytest.raises(ValueError, match=r"switch_step='soon' must be an int >= 0 or 'auto'"):
    opd_family.validate_distill(_config("method=opd_then_rl,switch=soon", teacher="/t"))
  config = _config("method=joint:kdrl", teacher="/t")
  config.distill.knobs.tau = 0.5
  with pytest.raises(ValueError, match=r"method 'joint:kdrl' has no setting\(s\) \['tau'\]; "
                                       r"its settings: beta"):
    opd_family.validate_distill(config)
  config = _config("method=tgopd", teacher="/t")
  config.distill.knobs.tau = 0.5
  opd_family.validate_distill(config)
  # The method object validates in its constructor, before the loop builds anything.
  with pytest.raises(ValueError, match="needs a teacher"):
    opd_family.OPDFamily(_config("method=opd"))


def test_teacher_vocabulary_must_be_the_students(tmp_path):
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"vocab_size": 151936}))
  with pytest.raises(ValueError, match=r"config.distill.teacher='.*hf' has a vocabulary of "
                                       r"151936 ids; the student's has 128"):
    opd_family.check_teacher_vocabulary(StartPoint("init_from_hf", hf),
                                        what="config.distill.teacher", vocab_size=128,
                                        tokenizer="char")
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"tokenizer": "byte", "model_overrides": {}}))
  with pytest.raises(ValueError, match=r"teacher_ref='.*checkpoints' was trained with tokenizer "
                                       r"'byte'; the student uses 'char'"):
    opd_family.check_teacher_vocabulary(StartPoint("init_from_checkpoint", run / "checkpoints", 3),
                                        what="config.distill.teacher_ref", vocab_size=128,
                                        tokenizer="char")
  (run / "config.json").write_text(json.dumps({"tokenizer": "char", "model_overrides": {}}))
  opd_family.check_teacher_vocabulary(StartPoint("init_from_checkpoint", run / "checkpoints", 3),
                                      what="config.distill.teacher", vocab_size=128,
                                      tokenizer="char")
  with pytest.raises(FileNotFoundError, match=r"config.distill.teacher='.*nothing'"):
    opd_family.locate_teacher(str(tmp_path / "nothing"), "config.distill.teacher")


def test_state_dict_round_trips_through_json(loader_position):
  config = _config("method=opd_then_rl,runlocal", teacher="/t")
  method = opd_family.OPDFamily(config)
  method.data_iter = loader_position()
  method.data_iter.set_state({"next_index": 7})
  method.tv_state = losses.TVOPDState(D_bar=jnp.float32(0.123456789), D_ref=jnp.float32(0.3),
                                      c=jnp.float32(0.7071), initialized=jnp.bool_(True))
  method.eval_history = [(0, 0.25), (1, 0.5)]
  method.switch_step = 1
  saved = json.loads(json.dumps(method.state_dict()))

  other = opd_family.OPDFamily(config)
  other.data_iter = loader_position()
  other.load_state_dict(saved)
  assert other.data_iter.get_state() == {"next_index": 7}
  for a, b in zip(other.tv_state, method.tv_state):
    assert a.dtype == b.dtype and a == b  # float32 values survive JSON exactly
  assert other.eval_history == method.eval_history and other.switch_step == 1
  assert other.state_dict() == saved


def test_auto_switch_follows_the_evaluation_history_of_the_opd_phase():
  config = _config("method=opd_then_rl", teacher="/t")  # 30 steps: budget S = 12
  method = opd_family.OPDFamily(config)
  assert method.switch_step == 12
  scores = {0: 0.1, 4: 0.3, 8: 0.3}
  method.evaluator = lambda params, step: {"eval/accuracy": scores[step]}
  state = type("S", (), {"params": None})()
  for step in (0, 4, 8):
    record = method.evaluate(state, step)
  # Window 3: an evaluation needs 3 earlier ones before it can stop OPD; S stays the budget.
  assert record["eval/switch_step"] == 12
  config.distill.switch.window = 2
  method = opd_family.OPDFamily(config)
  method.evaluator = lambda params, step: {"eval/accuracy": scores[step]}
  for step in (0, 4, 8):
    record = method.evaluate(state, step)
  assert method.switch_step == 8 and record["eval/switch_step"] == 8
  assert method.eval_history == [(0, 0.1), (4, 0.3), (8, 0.3)]
  # Later (RL-phase) evaluations are not part of the history.
  scores[12] = 0.9
  method.evaluate(state, 12)
  assert method.switch_step == 8 and len(method.eval_history) == 3
  # A fixed S ignores the history.
  fixed = opd_family.OPDFamily(_config("method=opd_then_rl,switch=5", teacher="/t"))
  assert fixed.switch_step == 5


def _batch(rows=4, time=5, seed=0):
  rng = np.random.default_rng(seed)
  mask = np.arange(time)[None] < rng.integers(1, time + 1, rows)[:, None]
  return dict(completion_mask=mask,
              old_logp=np.where(mask, rng.uniform(-3, -0.1, (rows, time)), 0).astype(np.float32),
              teacher_logp=np.where(mask, rng.uniform(-3, -0.1, (rows, time)), 0
                                    ).astype(np.float32))


def _advantages(method, batch, step=1, correct=(1.0, 0.0, 0.0, 1.0)):
  group_ids = np.array([0, 0, 1, 1], np.int32)
  seq_adv = np.array([0.5, -0.5, -1.0, 1.0], np.float32)
  extra = {"ends_with_eos": np.array([True, False, True, True])}
  adv, metrics = method.advantages(step, batch, seq_adv, np.asarray(correct, np.float32),
                                   group_ids, 2, None, extra)
  return adv, metrics, extra, seq_adv, group_ids


def test_advantages_are_the_pure_functions():
  batch = _batch()
  mask, old, teacher = batch["completion_mask"], batch["old_logp"], batch["teacher_logp"]

  method = opd_family.OPDFamily(_config("method=opd", teacher="/t"))
  adv, metrics, *_ = _advantages(method, batch)
  np.testing.assert_array_equal(adv, losses.sampled_token_opd_reward(old, teacher, mask))
  assert metrics["distill/teacher_gap_mean"] == pytest.approx((teacher - old)[mask].mean())

  # TV-OPD: c_k · sign(Δ) with the state's coefficient; the new state is only proposed.
  method = opd_family.OPDFamily(_config("method=tv_opd", teacher="/t"))
  method.tv_state = method.tv_state._replace(c=jnp.float32(0.5), initialized=jnp.bool_(True))
  adv, metrics, *_ = _advantages(method, batch)
  want, proposed = losses.tv_opd_advantages(teacher, old, mask, method.tv_state)
  np.testing.assert_array_equal(adv, want)
  assert metrics["distill/tv_coef"] == 0.5
  before = method.tv_state
  method.commit_tv([{"skipped": 0}, {"skipped": 1}])  # one update was non-finite: no advance
  assert all(a == b for a, b in zip(method.tv_state, before))
  _advantages(method, batch)
  method.commit_tv([{"skipped": 0}, {"skipped": 0}])
  assert all(a == b for a, b in zip(method.tv_state, proposed))

  # An Eq. 7 ablation by name.
  method = opd_family.OPDFamily(_config("method=tv_opd,tv_variant=group_constant",
                                        teacher="/t"))
  adv, *_ = _advantages(method, batch)
  np.testing.assert_array_equal(adv, losses.group_constant_opd_advantages(teacher, old, mask))

  # TRRD: the modulated ratio's old_logp and logp_scale go into the batch.
  config = _config("method=joint:trrd", teacher="/t", mask_final_eos=True)
  config.distill.knobs.alpha = 0.25
  method = opd_family.OPDFamily(config)
  adv, _, extra, seq_adv, _ = _advantages(method, batch)
  eos = losses.final_eos_mask(mask, np.array([True, False, True, True]))
  terms = losses.joint_opd_advantages("trrd", seq_adv, teacher, old, None, mask, alpha=0.25,
                                      eos_mask=eos)
  np.testing.assert_array_equal(adv, terms.adv)
  np.testing.assert_array_equal(extra["old_logp"], terms.old_logp)
  np.testing.assert_array_equal(extra["logp_scale"], terms.logp_scale)
  assert "ends_with_eos" not in extra

  # HDPO needs the groups: group 1 has reward only on its second row, group 0 on its first.
  method = opd_family.OPDFamily(_config("method=joint:hdpo", teacher="/t"))
  adv, _, _, seq_adv, group_ids = _advantages(method, batch, correct=(0.0, 0.0, 1.0, 0.0))
  terms = losses.hdpo_advantages(seq_adv, teacher, old, np.array([0.0, 0.0, 1.0, 0.0]), mask,
                                 group_ids=group_ids, num_groups=2)
  np.testing.assert_array_equal(adv, terms.adv)

  # OPDVR: gated by correctness.
  method = opd_family.OPDFamily(_config("method=opdvr", teacher="/t"))
  adv, *_ = _advantages(method, batch)
  want = losses.opdvr_advantages(teacher, old, mask, rewards=np.array([1.0, 0.0, 0.0, 1.0]))
  np.testing.assert_array_equal(adv, want)

  # OPD-then-RL: OPD at step ≤ S, GRPO after.
  method = opd_family.OPDFamily(_config("method=opd_then_rl,switch=2", teacher="/t"))
  adv, metrics, _, seq_adv, _ = _advantages(method, batch, step=2)
  np.testing.assert_array_equal(adv, losses.sampled_token_opd_reward(old, teacher, mask))
  assert metrics["distill/opd_phase"] == 1.0
  adv, metrics, *_ = _advantages(method, batch, step=3)
  np.testing.assert_array_equal(adv, np.where(mask, seq_adv[:, None], 0.0))
  assert metrics["distill/opd_phase"] == 0.0


def test_oprd_transform_in_the_chunked_policy_loss():
  """OPRD through `make_policy_loss(logits_transform=...)`: the loss value is the plain one,
  the gradient is corrected, and chunking the logits (3 positions per chunk of 7) gives the
  same gradient as one chunk."""
  model = CausalLM(get_model_config("tiny", vocab_size=32, logit_chunk_size=0),
                   rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  rows, p, t, k = 4, 3, 7, 4
  batch = dict(prompt_tokens=jnp.asarray(rng.integers(1, 32, (rows, p)), jnp.int32),
               prompt_mask=jnp.ones((rows, p), bool),
               completion_tokens=jnp.asarray(rng.integers(1, 32, (rows, t)), jnp.int32),
               completion_mask=jnp.asarray(np.arange(t)[None] < np.array([7, 5, 3, 6])[:, None]))
  old = score_model(model, *(batch[key] for key in grpo.ROLLOUT_KEYS), top_k=k,
                    chunk_size=0)
  ids, slot = losses.oprd_support(batch["completion_tokens"], old.topk_ids,
                                  batch["completion_mask"])
  direction = losses.oprd_direction(jnp.asarray(rng.normal(size=ids.shape), jnp.float32),
                                    jnp.zeros(ids.shape, jnp.float32), slot)
  lam = jnp.full((rows, t), 0.5, jnp.float32)
  batch.update(old_logp=jax.lax.stop_gradient(old.logp),
               adv=jnp.asarray([1.0, -1.0, 0.5, -0.5]), oprd_ids=ids, oprd_direction=direction,
               oprd_slot_mask=slot, oprd_lam_pos=lam, oprd_lam_neg=lam, num_tokens=jnp.float32(
                 batch["completion_mask"].sum()), num_sequences=jnp.float32(rows))
  def grads(chunk, transform):
    kwargs = dict(logits_transform=opd_family.oprd_chunk_transform,
                  transform_keys=opd_family.OPRD_KEYS) if transform else {}
    loss_fn = make_policy_loss(**kwargs)
    # The same parameters (same seed) with `chunk` logit positions per chunk.
    m = CausalLM(get_model_config("tiny", vocab_size=32, logit_chunk_size=chunk),
                 rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(m)
    return jax.value_and_grad(lambda q: loss_fn(nnx.merge(graphdef, q), batch)[0])(params)

  plain_value, plain = grads(0, False)
  value, one = grads(0, True)
  chunked_value, chunked = grads(3, True)
  assert float(value) == pytest.approx(float(plain_value), abs=1e-6)
  assert float(chunked_value) == pytest.approx(float(value), abs=1e-6)
  leaves = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])  # noqa: E731
  np.testing.assert_allclose(leaves(chunked), leaves(one), rtol=1e-5, atol=1e-7)
  assert np.abs(leaves(one) - leaves(plain)).max() > 1e-4  # the correction did something
