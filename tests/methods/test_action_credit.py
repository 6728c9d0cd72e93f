"""FACTOR as a turn-GRPO batch hook (methods.action_credit): TD credit from Monte-Carlo
continuations of turn snapshots, hindsight token coefficients, the host loss = factor_loss."""

import dataclasses
import doctest

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.envs import get_env, identity
from jaxrl_post.losses.factor import factor_loss
from jaxrl_post.methods import action_credit, rtpo
from jaxrl_post.methods.action_credit import ActionCredit, FactorConfig, check_factor_protocol
from jaxrl_post.sampling import FINISH_STOP, multiturn
from jaxrl_post.sampling.multiturn import Generation

TOK = multiturn.build_tokenizer("char_tools")
KV = get_env("kv_lookup", horizon=2, num_keys=8)  # max_turns = 4
EPS = 1e-6


def test_doctests():
  assert doctest.testmod(action_credit, raise_on_error=False).failed == 0


def _oracle(text):
  """Follows the last key seen; answers once the store returned a number."""
  last = text.rsplit("<obs>", 1)
  if len(last) == 1:
    return f"<tool>get({text.split('from ')[1].split(' ')[0]})</tool>"
  value = last[1].split("</obs>")[0]
  return f"<answer>{value}</answer>" if value.isdigit() else f"<tool>get({value})</tool>"


def _gen(action):
  ids = np.asarray(TOK.encode(action), np.int32)
  return Generation(ids, np.full(len(ids), -0.5, np.float32), FINISH_STOP)


def oracle_policy(contexts, rng):
  del rng
  return [_gen(_oracle(TOK.decode(ids, skip_special=False))) for ids in contexts]


@dataclasses.dataclass
class Script:
  actions: list

  def __call__(self, contexts, rng):
    assert len(contexts) == 1
    return [_gen(self.actions.pop(0))]


def _play(scripts, index=0):
  out = []
  for script in scripts:
    out += multiturn.rollout(KV, [KV.initial_state(index)], Script(list(script)), tokenizer=TOK,
                             context=identity(), max_context_len=256, rng=jax.random.key(0))
  return out


def _score_rule(context, action):
  """A deterministic stand-in log-prob per action token, depending on the context."""
  s = int(np.sum(context))
  return np.array([-((31 * s + 7 * j + 13 * int(a)) % 11) / 8 for j, a in enumerate(action)],
                  np.float32)


@dataclasses.dataclass
class FakeBackend:
  """Continuations with the oracle (every on-track snapshot is worth 1); scoring by rule."""

  starts: list = dataclasses.field(default_factory=list)
  scored: list = dataclasses.field(default_factory=list)

  def rollout(self, params, starts, rng, *, greedy=False):
    self.starts.append(list(starts))
    return multiturn.rollout(KV, starts, oracle_policy, tokenizer=TOK, context=identity(),
                             max_context_len=256, rng=rng)

  def turn_batch(self, turns, adv, weight=None):
    return multiturn.turn_batch(turns, adv, pad_id=TOK.pad_id, context_len=256, action_len=24,
                                weight=weight)

  def score(self, params, batch):
    out = np.zeros(batch.loss_mask.shape, np.float32)
    for r in range(batch.num_rows):
      ctx = batch.prompt_tokens[r][batch.prompt_mask[r]]
      act = batch.completion_tokens[r][batch.loss_mask[r]]
      out[r, :len(act)] = _score_rule(ctx, act)
    self.scored.append((batch, out))
    return out


def _hook(backend, **knobs):
  return ActionCredit(backend=backend, tokenizer=TOK, max_context_len=256, group_size=2,
                      total_steps=4, config=FactorConfig(checkpoints=1, continuations=2,
                                                         **knobs))


def _batch(trajs):
  turns = [t for tr in trajs for t in tr.turns]
  return multiturn.turn_batch(turns, np.zeros(len(turns)), pad_id=TOK.pad_id, context_len=256,
                              action_len=24)


def _apm(a, delta, eta, tau=1.0, d=3.0):
  """ρ_j = (1 − η)/L + η softmax_j(sgn(A) clip(Δ_j)/τ);  C_j = L ρ_j A   (one action, loops)."""
  s = [np.sign(a) * min(max(x, -d), d) / tau for x in delta]
  z = sum(np.exp(v) for v in s)
  big_l = len(delta)
  return [big_l * ((1 - eta) / big_l + eta * np.exp(v) / z) * a for v in s]


def test_td_credit_from_continuations_by_hand():
  demo = list(KV.make_episode("train", 0).demonstration)
  trajs = _play([demo, [demo[0], "<answer>0</answer>"]])  # G = 1 and 0: b = 0.5, σ = 0.5
  backend = FakeBackend()
  hook = _hook(backend, hta=False)
  out, metrics = hook.at_step(0)(None, trajs, _batch(trajs))
  # Checkpoints: T = 3 → t = 2 (after both hops), T = 2 → t = 1 (after hop 1); the oracle
  # finishes both, so V̂ = 1. Ṽ (episode 0) = (0.5, 0.75, 1), (episode 1) = (0.5, 1);
  # A* = r_t + Ṽ_{t+1} − Ṽ_t, divided by σ = 0.5.
  # In chunks of the step's rollout count (2): shapes the sampler already compiled.
  assert [[s.turn for s in call] for call in backend.starts] == [[2, 2], [1, 1]]
  assert metrics["factor/continuations"] == 4
  a_star = np.array([0.25, 0.25, 0.0, 0.5, -1.0]) / (0.5 + EPS)
  n = 5
  mask = out.loss_mask[:n]
  np.testing.assert_allclose(out.adv[:n], np.where(mask, a_star[:, None], 0), rtol=1e-5,
                             atol=1e-6)
  # Σ_t A*_t = the (population-std) GRPO advantage ±1.
  assert a_star[:3].sum() == pytest.approx(0.5 / (0.5 + EPS)) and metrics[
    "factor/astar_sum_gap"] < 1e-5
  assert metrics["factor/eta"] == 0.0 and metrics["factor/sign_agree"] == 1.0


def test_hindsight_coefficients_keep_the_action_mean():
  demo = list(KV.make_episode("train", 0).demonstration)
  trajs = _play([demo, [demo[0], "<answer>0</answer>"]])
  backend = FakeBackend()
  out, metrics = _hook(backend).at_step(2)(None, trajs, _batch(trajs))
  eta = 0.7 + (0.3 - 0.7) * 2 / 4  # the linear anneal at step 2 of 4
  assert metrics["factor/eta"] == pytest.approx(eta)
  # With a token budget, η follows the fraction spent, whatever the step count.
  assert _hook(backend).at_step(3, 0.5).eta() == pytest.approx(0.7 + (0.3 - 0.7) * 0.5)
  assert _hook(backend).at_step(1, 1.0).eta() == pytest.approx(0.3)
  assert _hook(backend, hta=False).at_step(1, 0.2).eta() == 0.0
  with pytest.raises(ValueError, match="progress=1.5 must be in"):
    _hook(backend).at_step(0, 1.5)
  (teacher, t_logp), (student, s_logp) = backend.scored
  # The teacher's rows are the student's contexts plus the hindsight line, same actions.
  assert "[hindsight: " in TOK.decode(teacher.prompt_tokens[0][teacher.prompt_mask[0]],
                                      skip_special=False)
  np.testing.assert_array_equal(teacher.completion_tokens, student.completion_tokens)
  a_star = np.array([0.25, 0.25, 0.0, 0.5, -1.0]) / (0.5 + EPS)
  for r in range(5):
    m = out.loss_mask[r]
    delta = (t_logp[r] - s_logp[r])[m]
    np.testing.assert_allclose(out.adv[r][m], _apm(a_star[r], delta, eta), rtol=1e-5,
                               atol=1e-6)
    assert out.adv[r][m].mean() == pytest.approx(a_star[r], abs=1e-5)
  assert metrics["factor/multiplier_dev"] < 1e-5 and metrics["factor/sign_agree"] == 1.0
  # Tokens moved away from the uniform allocation.
  assert sum(not np.allclose(out.adv[r][out.loss_mask[r]], a_star[r]) for r in range(5)) >= 3


def test_equal_returns_need_no_continuations_and_no_tac_is_uniform():
  demo = list(KV.make_episode("train", 0).demonstration)
  backend = FakeBackend()
  same = _play([demo, demo])
  out, metrics = _hook(backend)(None, same, _batch(same))
  assert metrics["factor/continuations"] == 0 and not backend.starts
  assert not np.any(out.adv)
  trajs = _play([demo, [demo[0], "<answer>0</answer>"]])
  out, metrics = _hook(FakeBackend(), tac=False, hta=False)(None, trajs, _batch(trajs))
  uniform = np.array([1 / 3] * 3 + [-1 / 2] * 2) * 0.5 / (0.5 + EPS)  # ±1 over T_i actions
  np.testing.assert_allclose(out.adv[:5], np.where(out.loss_mask[:5], uniform[:, None], 0),
                             rtol=1e-5, atol=1e-6)
  assert metrics["factor/continuations"] == 0


def test_host_turn_loss_is_factor_loss():
  # Three action rows of lengths 2, 3, 1; per-token advantages C; ratios away from 1 (clipped).
  rng = np.random.default_rng(0)
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
  c = np.where(mask, rng.normal(size=mask.shape), 0).astype(np.float32)
  logp = rng.normal(size=mask.shape).astype(np.float32) * 0.3
  old = rng.normal(size=mask.shape).astype(np.float32) * 0.3
  batch = {"adv": jnp.asarray(c), "weight": jnp.ones(3), "loss_mask": jnp.asarray(mask),
           "old_logp": jnp.asarray(old), "num_tokens": jnp.float32(mask.sum()),
           "num_sequences": jnp.float32(3)}
  host, _ = rtpo.batch_loss(jnp.asarray(logp), batch, loss="grpo", loss_kwargs=dict(
    loss_agg_mode=action_credit.FACTOR_LOSS_AGG, epsilon_low=0.2, epsilon_high=0.2))
  want, _ = factor_loss(logp[None], old[None], c[None], mask[None], np.ones((1, 3)), eps=0.2)
  assert float(host) == pytest.approx(float(want), rel=1e-6)
  # By hand: −mean over actions of the token-mean of min(qC, clip(q)C).
  q = np.exp(logp - old)
  obj = np.minimum(q * c, np.clip(q, 0.8, 1.2) * c)
  assert float(want) == pytest.approx(-np.mean([obj[i][mask[i]].mean() for i in range(3)]),
                                      rel=1e-5)


def test_config_errors_name_the_key():
  with pytest.raises(ValueError, match="config.factor.checkpoints"):
    FactorConfig(checkpoints=0)
  with pytest.raises(ValueError, match="config.factor.continuations"):
    FactorConfig(continuations=True)
  with pytest.raises(ValueError, match="config.factor.eta_end"):
    FactorConfig(eta_end=1.5)
  with pytest.raises(ValueError, match="config.factor.tau"):
    FactorConfig(tau=0.0)
  with pytest.raises(ValueError, match="config.factor.template"):
    FactorConfig(template="no field")
  with pytest.raises(ValueError, match=r"unknown config.factor keys \['checkpoint'\]"):
    FactorConfig.from_config({"checkpoint": 2})
  with pytest.raises(ValueError, match="config.loss.loss_agg_mode"):
    check_factor_protocol({"name": "grpo", "loss_agg_mode": "token-mean"})
  with pytest.raises(ValueError, match="config.loss.name"):
    check_factor_protocol({"name": "rtpo", "loss_agg_mode": "seq-mean-token-mean"})
  trajs = _play([list(KV.make_episode("train", 0).demonstration)] * 3)
  with pytest.raises(ValueError, match="group_size=2"):
    _hook(FakeBackend())(None, trajs, _batch(trajs))
  with pytest.raises(ValueError, match="turn rows"):
    _hook(FakeBackend())(None, trajs[:2], _batch(trajs))


def test_binary_checks_factor_knobs_before_building_the_model():
  path = rtpo.__file__.replace("jaxrl_post/methods/rtpo.py", "configs/factor.py")
  config = load_module(path).get_config("runlocal,horizon=2")
  assert config.factor.checkpoints == 1 and config.loss.loss_agg_mode == "seq-mean-token-mean"
  config.loss.loss_agg_mode = "token-mean"
  with pytest.raises(ValueError, match="config.loss.loss_agg_mode"):
    rtpo.RTPO(config).build_model(None)
  config = load_module(path).get_config("runlocal,horizon=2")
  config.factor = ml_collections.ConfigDict({"continuations": 0})
  with pytest.raises(ValueError, match="config.factor.continuations"):
    rtpo.RTPO(config).build_model(None)
