"""OCSD on the multi-turn loop (arXiv 2608.04788): replay views, per-token advantages, config."""

import dataclasses
import doctest
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post import losses
from jaxrl_post.config_args import load_module
from jaxrl_post.envs import get_env, identity
from jaxrl_post.losses import rtpo as rtpo_losses
from jaxrl_post.methods import ocsd, rtpo
from jaxrl_post.sampling import FINISH_STOP, multiturn
from jaxrl_post.sampling.multiturn import Generation

TOK = multiturn.build_tokenizer("char_tools")
KV = get_env("kv_lookup", horizon=3, num_keys=8)


def test_doctests():
  assert doctest.testmod(ocsd, raise_on_error=False).failed == 0


# ---- a scripted kv_lookup player (as tests/training/test_multiturn.py's) ----


def _oracle_action(text: str) -> str:
  """Follows the last key seen; answers once the store returned a number."""
  last = text.rsplit("<obs>", 1)
  if len(last) == 1:
    return f"<tool>get({text.split('from ')[1].split(' ')[0]})</tool>"
  value = last[1].split("</obs>")[0]
  return f"<answer>{value}</answer>" if value.isdigit() else f"<tool>get({value})</tool>"


@dataclasses.dataclass
class SlipPolicy:
  """The oracle, or with probability `slip` per row a wrong final answer; made-up log-probs."""

  slip: float = 0.0

  def __call__(self, contexts, rng):
    draws = np.asarray(jax.random.uniform(rng, (len(contexts),)))
    out = []
    for ids, u in zip(contexts, draws, strict=True):
      text = TOK.decode(ids, skip_special=False)
      action = "<answer>0</answer>" if u < self.slip else _oracle_action(text)
      ids = np.asarray(TOK.encode(action), np.int32)
      # Varying per-token NLLs, so the uncertain-step choice is not decided by ties.
      logp = -0.05 * ((np.arange(len(ids)) * 7 + len(text)) % 13 + 1).astype(np.float32)
      out.append(Generation(ids, logp, FINISH_STOP))
    return out


def _rollout(starts, slip=0.0, rng=0):
  return multiturn.rollout(KV, starts, SlipPolicy(slip), tokenizer=TOK, context=identity(),
                           max_context_len=256, rng=jax.random.key(rng))


def _decode(ids):
  return TOK.decode(np.asarray(ids).tolist(), skip_special=False)


# ---- the replay views ----


def test_full_and_ablated_views_differ_only_in_the_observation_span():
  (traj,) = _rollout([KV.initial_state(3)])
  config = ocsd.OCSDConfig()
  assert len(traj.turns) == 4 and traj.reward == 1.0  # 3 hops, then the answer
  for turn in traj.turns:
    views = ocsd.replay_contexts(turn, tokenizer=TOK, config=config, max_len=256)
    (start, stop_f), (start_a, stop_a) = views.observation, views.placeholder
    assert start == start_a and views.cut == 0
    # Every token but the observation span is shared, in place: history ⊕ prefix, then suffix.
    np.testing.assert_array_equal(views.full[:start], views.ablated[:start])
    np.testing.assert_array_equal(views.full[stop_f:], views.ablated[stop_a:])
    assert _decode(views.full[:start]) == _decode(turn.context_ids) + "[hindsight: "
    assert _decode(views.full[stop_f:]) == "]\n"
    assert _decode(views.ablated[start:stop_a]) == "not provided"
    observed = _decode(views.full[start:stop_f])
    if turn.turn.done:  # the answer: no reply, so the terminal feedback with the reward
      assert turn.turn.observation == "" and observed == "reward 1"
    else:  # o_{k+1}: the value the store returned for this action's key
      assert observed == turn.turn.observation.strip() and observed.startswith("<obs>")
      assert observed == ocsd.observation_text(turn)
  # As rows, the action tokens are the turn's own and sit at the same columns in both views.
  full, ablated = ocsd.replay_turns(traj.turns, tokenizer=TOK, config=config, max_len=256)
  batch = multiturn.turn_batch([*full, *ablated], np.zeros(8), pad_id=TOK.pad_id,
                               context_len=256, action_len=24)
  n = len(traj.turns)
  for key in ("completion_tokens", "completion_mask", "loss_mask", "turn_ids", "rollout_logp"):
    value = getattr(batch, key)
    np.testing.assert_array_equal(value[:n], value[n:], err_msg=key)
  for row, turn in enumerate(traj.turns):
    np.testing.assert_array_equal(batch.completion_tokens[row, :len(turn.action_ids)],
                                  turn.action_ids)
  # A failed answer's terminal feedback carries its reward.
  (failed,) = _rollout([KV.initial_state(3)], slip=1.0)
  assert failed.turns[-1].turn.done and failed.reward == 0.0
  views = ocsd.replay_contexts(failed.turns[-1], tokenizer=TOK, config=config, max_len=256)
  assert _decode(views.full[slice(*views.observation)]) == "reward 0"


def test_views_that_do_not_fit_lose_the_same_oldest_history():
  (traj,) = _rollout([KV.initial_state(3)])
  config = ocsd.OCSDConfig(template="[seen: {observation}] ", placeholder="?")
  turn = traj.turns[2]
  views = ocsd.replay_contexts(turn, tokenizer=TOK, config=config, max_len=48)
  (start, stop_f), (_, stop_a) = views.observation, views.placeholder
  assert views.cut > 0 and len(views.full) == 48 and len(views.ablated) < 48
  history = start - len("[seen: ")
  np.testing.assert_array_equal(views.full[:history], turn.context_ids[views.cut:])
  np.testing.assert_array_equal(views.full[:start], views.ablated[:start])
  np.testing.assert_array_equal(views.full[stop_f:], views.ablated[stop_a:])
  full, ablated = ocsd.replay_turns([turn], tokenizer=TOK, config=config, max_len=48)
  assert full[0].context_cut and ablated[0].context_cut
  np.testing.assert_array_equal(full[0].action_ids, turn.action_ids)


# ---- the method step: turn GRPO with the OCSD hook ----


@dataclasses.dataclass(frozen=True)
class FakeState:
  params: int


@dataclasses.dataclass
class FakeBackend:
  """`rtpo.Backend` with the scripted player; `score` depends on the row's context, so the Full
  and Ablated views of an action get different log-probs."""

  slip: float
  log: list = dataclasses.field(default_factory=list)

  def rollout(self, params, starts, rng, *, greedy=False):
    out = _rollout(starts, slip=self.slip, rng=0)
    del rng
    self.log.append(("rollout", params, out))
    return out

  def turn_batch(self, turns, adv, weight=None):
    return multiturn.turn_batch(turns, adv, pad_id=TOK.pad_id, context_len=256, action_len=24,
                                weight=weight)

  def flat_batch(self, trajectories, adv):
    raise AssertionError("OCSD trains turn rows")

  def score(self, params, batch):
    n = batch.num_rows
    context = np.where(batch.prompt_mask[:n], batch.prompt_tokens[:n], 0).sum(1, keepdims=True)
    columns = np.arange(batch.completion_tokens.shape[1])[None]
    logp = -0.1 - 0.3 * (((context * 7 + columns * 3) % 11) / 11.0) - 0.01 * params
    logp = np.where(batch.loss_mask[:n], logp, 0.0).astype(np.float32)
    self.log.append(("score", params, batch, logp))
    return logp

  def ppo(self, state, batch, *, rng):
    self.log.append(("ppo", state.params, batch))
    return FakeState(state.params + 1), {"loss": 0.0, "num_updates": 1.0}


def _hand_ocsd(trajectories, full_logp, ablated_logp, seq_adv, *, rho, beta):
  """`losses.ocsd_advantages` on each episode's action tokens laid end to end (another layout
  than the method's `[episodes, K, La]` blocks), back to one row per turn."""
  width = max(sum(len(t.action_ids) for t in traj.turns) for traj in trajectories)
  e = len(trajectories)
  full, abl, old = (np.zeros((e, width), np.float32) for _ in range(3))
  steps = np.full((e, width), -1, np.int32)
  row, where = 0, []
  for i, traj in enumerate(trajectories):
    at = 0
    for k, turn in enumerate(traj.turns):
      m = len(turn.action_ids)
      full[i, at:at + m], abl[i, at:at + m] = full_logp[row, :m], ablated_logp[row, :m]
      old[i, at:at + m], steps[i, at:at + m] = turn.logp, k
      where.append((i, at, m))
      row, at = row + 1, at + m
  num_steps = max(len(traj.turns) for traj in trajectories)
  adv = np.asarray(losses.ocsd_advantages(seq_adv, full, abl, old, steps, steps >= 0,
                                          num_steps=num_steps, rho=rho, beta=beta))
  out = np.zeros((row, 24), np.float32)
  for r, (i, at, m) in enumerate(where):
    out[r, :m] = adv[i, at:at + m]
  q = np.asarray(losses.observation_calibration(full, abl, steps >= 0))
  return out, q[steps >= 0]


def test_ocsd_step_trains_the_loss_per_token_advantages():
  backend = FakeBackend(slip=0.3)
  config = ocsd.OCSDConfig(rho=0.3, beta=0.5)
  hook = ocsd.Calibrator(backend, TOK, 256, config)
  starts = [KV.initial_state(i) for i in range(3)]
  method = rtpo.MethodConfig(method=rtpo.OCSD_HOST, group_size=4)
  out = rtpo.grpo_step(FakeState(0), backend, starts, config=method, rng=jax.random.key(0),
                       shuffle=np.random.default_rng(0), batch_hook=hook)
  (_, _, trajectories), full, ablated, (_, _, batch) = backend.log
  turns = [t for traj in trajectories for t in traj.turns]
  n = len(turns)
  for view in (full, ablated):  # scored with the rollout parameters, before the update
    assert view[0] == "score" and view[1] == 0 and view[2].num_rows == n
  assert full[2].prompt_tokens.sum() != ablated[2].prompt_tokens.sum()
  assert batch.num_rows == n and batch.adv.shape == (n, 24)
  logp = np.concatenate([full[3], ablated[3]])
  rewards = np.array([t.reward for t in trajectories], np.float32)
  assert 0 < rewards.mean() < 1 and len({len(t.turns) for t in trajectories}) > 1
  seq_adv = np.asarray(rtpo_losses.advantage_fn("grpo")(
    jnp.asarray(rewards), jnp.repeat(jnp.arange(3), 4), num_groups=3, eps=1e-6))
  want, q = _hand_ocsd(trajectories, logp[:n], logp[n:], seq_adv, rho=0.3, beta=0.5)
  np.testing.assert_allclose(batch.adv, want, rtol=1e-6, atol=1e-7)
  # Not trivially Â: some tokens were modulated, never across zero, within [1 − β, 1 + β]·Â.
  episode = np.repeat(np.arange(len(trajectories)), [len(t.turns) for t in trajectories])
  a = seq_adv[episode][:, None] * batch.loss_mask
  assert np.any(np.abs(batch.adv - a) > 1e-4)
  assert np.all(batch.adv * a >= 0) and np.all(np.abs(batch.adv) <= 1.5 * np.abs(a) + 1e-6)
  assert np.all(batch.adv[~batch.loss_mask] == 0)
  # Metrics: q over all action tokens, the selected share of steps, the factor on those steps.
  metrics = out.metrics
  assert metrics["ocsd/q_mean"] == pytest.approx(q.mean(), abs=1e-6)
  assert metrics["ocsd/q_abs_mean"] == pytest.approx(np.abs(q).mean(), abs=1e-6)
  keep = [max(1, int(np.floor(0.3 * len(t.turns) + 0.5))) for t in trajectories]
  assert metrics["ocsd/selected_frac"] == pytest.approx(sum(keep) / n)
  changed = batch.loss_mask & (np.abs(a) > 0) & (np.abs(batch.adv - a) > 0)
  assert 0.5 <= metrics["ocsd/adv_factor_mean"] <= 1.5 and changed.any()
  assert metrics["time/ocsd_score"] > 0 and out.state.params == 1


def test_hook_needs_turn_rows_and_a_grpo_host():
  backend = FakeBackend(slip=0.3)
  trajectories = _rollout([KV.initial_state(0), KV.initial_state(1)])
  turns = [t for traj in trajectories for t in traj.turns]
  hook = ocsd.Calibrator(backend, TOK, 256)
  with pytest.raises(ValueError, match="turn rows"):
    hook(0, trajectories, backend.turn_batch(turns[::-1], np.zeros(len(turns))))
  with pytest.raises(ValueError, match="GRPO host"):
    rtpo.method_step(FakeState(0), backend, [KV.initial_state(0)],
                     config=rtpo.MethodConfig(method="rtpo", group_size=3),
                     rng=jax.random.key(0), shuffle=np.random.default_rng(0), batch_hook=hook)


def test_batch_loss_takes_per_token_advantages_with_row_weights():
  rng = np.random.default_rng(0)
  logp = jnp.asarray(-rng.uniform(0.1, 2.0, (3, 5)), jnp.float32)
  mask = jnp.asarray(rng.uniform(size=(3, 5)) > 0.3)
  adv, weight = jnp.asarray([1.0, -2.0, 0.5]), jnp.asarray([1.0, 0.5, 2.0])
  batch = dict(old_logp=logp + 0.05, loss_mask=mask, weight=weight, adv=adv,
               num_tokens=mask.sum(), num_sequences=jnp.asarray(3))
  rows, _ = rtpo.batch_loss(logp, batch, loss="grpo")
  tokens, _ = rtpo.batch_loss(logp, dict(batch, adv=jnp.broadcast_to(adv[:, None], (3, 5))),
                              loss="grpo")
  np.testing.assert_allclose(tokens, rows, rtol=1e-6)


# ---- config ----


@pytest.mark.parametrize("knobs, key", [
  (dict(rho=1.5), "ocsd.rho"), (dict(rho=-0.1), "ocsd.rho"), (dict(beta=2.0), "ocsd.beta"),
  (dict(beta="x"), "ocsd.beta"), (dict(template="no field"), "ocsd.template"),
  (dict(template="{observation}{observation}"), "ocsd.template"),
  (dict(placeholder=" "), "ocsd.placeholder"), (dict(terminal="{score}"), "ocsd.terminal"),
  (dict(terminal=3), "ocsd.terminal"),
])
def test_bad_knobs_name_their_key(knobs, key):
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    ocsd.OCSDConfig(**knobs)


def test_the_binary_mode_validates_config_ocsd_before_building_anything():
  module = load_module(Path(__file__).resolve().parents[2] / "configs" / "ocsd.py")
  config = module.get_config("runlocal,horizon=2")
  assert config.method == "ocsd" and dict(config.ocsd) == dict(
    rho=0.2, beta=0.5, template=ocsd.DEFAULT_TEMPLATE, placeholder=ocsd.DEFAULT_PLACEHOLDER,
    terminal=ocsd.DEFAULT_TERMINAL)
  for key, value, match in [("rho", 1.2, r"config\.ocsd\.rho"),
                            ("template", "x" * 60 + "{observation}", r"config\.ocsd\.template")]:
    bad = module.get_config("runlocal,horizon=2")
    bad.ocsd[key] = value
    with pytest.raises(ValueError, match=match):
      rtpo.RTPO(bad).build_model(run=None)  # fails before it needs the run
  bad = module.get_config("runlocal,horizon=2")
  bad.ocsd.unlock()
  bad.ocsd.alpha = 1.0
  with pytest.raises(ValueError, match=r"config\.ocsd keys \['alpha'\]"):
    rtpo.RTPO(bad).build_model(run=None)
