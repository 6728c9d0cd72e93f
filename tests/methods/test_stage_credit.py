"""Temporal GRPO, Stage-Reward GRPO and CANOPY as turn-GRPO batch hooks (methods.stage_credit)."""

import dataclasses
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.envs import get_env, identity
from jaxrl_post.envs.tools import ERROR_TIMEOUT
from jaxrl_post.losses.canopy import canopy_loss
from jaxrl_post.methods import rtpo, stage_credit
from jaxrl_post.sampling import FINISH_STOP, multiturn
from jaxrl_post.sampling.multiturn import Generation

TOK = multiturn.build_tokenizer("char_tools")
KV = get_env("kv_lookup", horizon=3, num_keys=8)
G = 4


def test_doctests():
  assert doctest.testmod(stage_credit, raise_on_error=False).failed == 0


# ---- a scripted kv_lookup player ----


def _oracle_action(text: str) -> str:
  """Follows the last key seen; answers once the store returned a number."""
  last = text.rsplit("<obs>", 1)
  if len(last) == 1:
    return f"<tool>get({text.split('from ')[1].split(' ')[0]})</tool>"
  value = last[1].split("</obs>")[0]
  return f"<answer>{value}</answer>" if value.isdigit() else f"<tool>get({value})</tool>"


@dataclasses.dataclass
class SlipPolicy:
  """The oracle, but with probability `slip` per turn a wrong answer; with `wrong_final` every
  final answer is wrong (so every episode fails, at different stages)."""

  slip: float = 0.0
  wrong_final: bool = False

  def __call__(self, contexts, rng):
    draws = np.asarray(jax.random.uniform(rng, (len(contexts),)))
    out = []
    for ids, u in zip(contexts, draws, strict=True):
      action = _oracle_action(TOK.decode(ids, skip_special=False))
      if u < self.slip or (self.wrong_final and action.startswith("<answer>")):
        action = "<answer>0</answer>"
      ids = np.asarray(TOK.encode(action), np.int32)
      out.append(Generation(ids, np.full(len(ids), -0.5, np.float32), FINISH_STOP))
    return out


@dataclasses.dataclass(frozen=True)
class FakeState:
  params: int


@dataclasses.dataclass
class FakeBackend:
  """`rtpo.Backend` with the scripted player; records the batch of the PPO phase."""

  policy: SlipPolicy
  batches: list = dataclasses.field(default_factory=list)
  trajectories: list = dataclasses.field(default_factory=list)

  def rollout(self, params, starts, rng, *, greedy=False):
    out = multiturn.rollout(KV, starts, self.policy, tokenizer=TOK, context=identity(),
                            max_context_len=256, rng=jax.random.key(7))
    self.trajectories.append(out)
    return out

  def turn_batch(self, turns, adv, weight=None):
    return multiturn.turn_batch(turns, adv, pad_id=TOK.pad_id, context_len=256, action_len=24,
                                weight=weight)

  def flat_batch(self, trajectories, adv):
    raise AssertionError("the hooks train turn rows")

  def score(self, params, batch):
    raise AssertionError("the hooks do not score")

  def ppo(self, state, batch, *, rng):
    self.batches.append(batch)
    return FakeState(state.params + 1), {"loss": 0.0, "num_updates": 1.0}


def _step(hook, policy, *, prompts=3, skip=True):
  backend = FakeBackend(policy)
  method = rtpo.MethodConfig(method=rtpo.OCSD_HOST, group_size=G, skip_zero_advantage=skip)
  out = rtpo.grpo_step(FakeState(0), backend, [KV.initial_state(i) for i in range(prompts)],
                       config=method, rng=jax.random.key(0), shuffle=np.random.default_rng(0),
                       batch_hook=hook)
  return out, backend


# ---- independent numpy references (loops) ----


def _hand_stage_times(traj):
  """Stage k done at the turn the k-th successful `get` of the chain happened; the answer stage
  at a rewarded answer after all hops. Uses the oracle's structure: it only looks up chain keys."""
  times, turn = [], 0
  for t in traj.turns:
    turn += 1
    if t.turn.info["tool"] == "get" and not t.turn.observation.startswith("\n<obs>error"):
      times.append(turn)
    elif t.turn.info["answer"] is not None and t.turn.reward == 1.0 and len(times) == 3:
      times.append(turn)
  return times + [-1] * (4 - len(times))


def _hand_temporal(times, lengths, eps=1e-6):
  """Per-turn Temporal GRPO advantages of one group, by the paper's definitions, with loops."""
  g, k = len(times), len(times[0])
  done = [[times[i][j] >= 1 for j in range(k)] for i in range(g)]
  adv = [[0.0] * lengths[i] for i in range(g)]
  for j in range(k):
    part = [i for i in range(g) if j == 0 or done[i][j - 1]]
    if not part:
      continue
    r = {i: float(done[i][j]) for i in part}
    mu = sum(r.values()) / len(part)
    sd = (sum((r[i] - mu) ** 2 for i in part) / len(part)) ** 0.5
    for i in part:
      a = (r[i] - mu) / (sd + eps)
      start = 0 if j == 0 else times[i][j - 1]
      end = times[i][j] if done[i][j] else lengths[i]
      for t in range(start + 1, end + 1):
        adv[i][t - 1] += a
  return adv


# ---- Temporal GRPO ----


def test_temporal_grpo_rows_get_their_turns_stage_advantage():
  hook = stage_credit.StageCredit(env=KV, group_size=G)
  out, backend = _step(hook, SlipPolicy(slip=0.25))
  (trajectories,) = backend.trajectories
  (batch,) = backend.batches
  times = [_hand_stage_times(t) for t in trajectories]
  assert [KV.stage_times(t) for t in trajectories] == times
  # The draw mixes failures at several stages with successes.
  assert len({sum(x > 0 for x in t) for t in times}) >= 3
  want = []
  for p in range(3):
    group = range(p * G, (p + 1) * G)
    adv = _hand_temporal([times[i] for i in group], [len(trajectories[i].turns) for i in group])
    want += [a for row in adv for a in row]
  np.testing.assert_allclose(batch.adv[:batch.num_rows], want, rtol=1e-5, atol=1e-6)
  # A failed episode's completed stages can be credited positively (no sign preservation).
  rows = [(i, a) for i, traj in enumerate(trajectories) for a in
          batch.adv[sum(len(t.turns) for t in trajectories[:i]):][:len(traj.turns)]]
  assert any(trajectories[i].reward == 0 and a > 0 for i, a in rows)
  success = [np.mean([t[k] > 0 for t in times]) for k in range(4)]
  for k in range(4):
    assert out.metrics[f"stage/success_{k + 1}"] == pytest.approx(success[k])
  assert 0 < out.metrics["stage/participation"] <= 1
  assert out.metrics["train/num_updates"] == 1.0


def test_temporal_grpo_trains_steps_where_every_episode_fails():
  # Every episode fails, so the trajectory advantages are all 0 and turn GRPO skips the step;
  # the stages the episodes did complete still give Temporal GRPO a signal.
  policy = SlipPolicy(slip=0.3, wrong_final=True)
  out, backend = _step(stage_credit.StageCredit(env=KV, group_size=G), policy)
  assert all(t.reward == 0 for t in backend.trajectories[0])
  assert out.metrics["train/num_updates"] == 1.0 and len(backend.batches) == 1
  assert np.any(backend.batches[0].adv != 0)
  host, host_backend = _step(None, policy)
  assert host.metrics["train/num_updates"] == 0.0 and not host_backend.batches


def test_stage_reward_is_trajectory_grpo_on_the_stage_fraction():
  hook = stage_credit.StageCredit(env=KV, group_size=G, mode="stage_reward")
  _, backend = _step(hook, SlipPolicy(slip=0.25))
  (trajectories,) = backend.trajectories
  (batch,) = backend.batches
  frac = [sum(x > 0 for x in _hand_stage_times(t)) / 4 for t in trajectories]
  want = []
  for p in range(3):
    r = frac[p * G:(p + 1) * G]
    mu = sum(r) / G
    sd = (sum((x - mu) ** 2 for x in r) / (G - 1)) ** 0.5  # the host's GRPO: Bessel std
    for i, x in enumerate(r):
      want += [(x - mu) / (sd + 1e-6)] * len(trajectories[p * G + i].turns)
  np.testing.assert_allclose(batch.adv[:batch.num_rows], want, rtol=1e-5, atol=1e-6)


def test_stage_hook_errors():
  with pytest.raises(ValueError, match="mode"):
    stage_credit.StageCredit(env=KV, group_size=G, mode="stage")
  with pytest.raises(ValueError, match="group_size"):
    stage_credit.StageCredit(env=KV, group_size=1)
  hook = stage_credit.StageCredit(env=KV, group_size=G)
  backend = FakeBackend(SlipPolicy())
  trajectories = backend.rollout(0, [KV.initial_state(0)] * G, None)
  turns = [t for traj in trajectories for t in traj.turns]
  batch = backend.turn_batch(turns[:-1], np.zeros(len(turns) - 1))
  with pytest.raises(ValueError, match="turn rows"):
    hook(0, trajectories, batch)
  with pytest.raises(ValueError, match="group_size=3"):
    stage_credit.StageCredit(env=KV, group_size=3)(0, trajectories, batch)


# ---- CANOPY ----


def _with_timeout(traj):
  """`traj` with a tool time-out on its first turn (an injected infrastructure fault)."""
  first = traj.turns[0]
  info = dict(first.turn.info, error=ERROR_TIMEOUT)
  turn = dataclasses.replace(first, turn=dataclasses.replace(first.turn, info=info))
  return dataclasses.replace(traj, turns=(turn, *traj.turns[1:]))


def _population_adv(rewards, valid, eps=1e-6):
  out = []
  for r, v in zip(rewards, valid, strict=True):
    kept = [x for x, ok in zip(r, v, strict=True) if ok]
    mu = sum(kept) / max(len(kept), 1)
    sd = (sum((x - mu) ** 2 for x in kept) / max(len(kept), 1)) ** 0.5
    out.append([(x - mu) / (sd + eps) if ok and sd + eps > 0 else 0.0
                for x, ok in zip(r, v, strict=True)])
  return out


def test_canopy_quarantines_faulted_rollouts_and_uses_the_population_std():
  backend = FakeBackend(SlipPolicy(slip=0.25))
  trajectories = list(backend.rollout(
    0, [KV.initial_state(i) for i in range(3) for _ in range(G)], None))
  trajectories[1] = _with_timeout(trajectories[1])  # a tool time-out: quarantined
  injected = np.zeros(3 * G, bool)
  injected[6] = True  # a fault flagged by the caller
  turns = [t for traj in trajectories for t in traj.turns]
  batch = backend.turn_batch(turns, np.zeros(len(turns)))
  hook = stage_credit.CanopyCredit(group_size=G)
  out, metrics = hook(0, trajectories, batch, quarantine=injected)
  valid = np.ones(3 * G, bool)
  valid[[1, 6]] = False
  rewards = np.array([t.reward for t in trajectories]).reshape(3, G)
  assert 0 < rewards.mean() < 1
  adv = np.array(_population_adv(rewards.tolist(), valid.reshape(3, G).tolist())).reshape(-1)
  want_rows = [i for i, traj in enumerate(trajectories) if valid[i] for _ in traj.turns]
  assert out.num_rows == len(want_rows) == len(turns) - len(trajectories[1].turns) - len(
    trajectories[6].turns)
  np.testing.assert_allclose(out.adv, adv[want_rows], rtol=1e-5, atol=1e-6)
  kept_turns = [t for i, traj in enumerate(trajectories) if valid[i] for t in traj.turns]
  for row, turn in enumerate(kept_turns):  # the rows that stay are the survivors' own
    np.testing.assert_array_equal(out.completion_tokens[row, :len(turn.action_ids)],
                                  turn.action_ids)
  assert metrics["canopy/quarantined"] == pytest.approx(2 / 12)
  mixed = [len({r for r, ok in zip(rewards[p], valid.reshape(3, G)[p], strict=True) if ok}) > 1
           for p in range(3)]
  assert metrics["canopy/coverage"] == pytest.approx(np.mean(mixed))
  # Without faults nothing is dropped; a quarantine mask of the wrong shape is rejected.
  clean = [t for i, t in enumerate(trajectories) if i != 1]
  clean.insert(1, backend.trajectories[0][1])
  clean_turns = [t for tr in clean for t in tr.turns]
  out, metrics = hook(0, clean, backend.turn_batch(clean_turns, np.zeros(len(clean_turns))))
  assert metrics["canopy/quarantined"] == 0 and out.num_rows == sum(len(t.turns) for t in clean)
  with pytest.raises(ValueError, match="quarantine"):
    hook(0, trajectories, batch, quarantine=np.zeros(5, bool))


def test_canopy_step_with_every_rollout_quarantined_is_skipped():
  hook = stage_credit.CanopyCredit(group_size=G)
  # Every first action is a wrong answer: well formed, so no fault, and reward 0 everywhere.
  # The hook's advantages are all 0: trained only when skip_zero_advantage is off.
  out, backend = _step(hook, SlipPolicy(slip=1.0), skip=False)
  assert out.metrics["train/num_updates"] == 1.0
  assert np.all(backend.batches[0].adv == 0) and out.metrics["canopy/quarantined"] == 0
  out, backend = _step(hook, SlipPolicy(slip=1.0), skip=True)
  assert out.metrics["train/num_updates"] == 0.0 and not backend.batches
  # Every rollout quarantined: no rows left, the step is skipped even with skipping off.

  class AllFaulted(stage_credit.CanopyCredit):
    def __call__(self, params, trajectories, batch, quarantine=None):
      return super().__call__(params, trajectories, batch,
                              quarantine=np.ones(len(trajectories), bool))

  out, backend = _step(AllFaulted(group_size=G), SlipPolicy(slip=0.25), skip=False)
  assert out.metrics["train/num_updates"] == 0.0 and not backend.batches
  assert out.metrics["canopy/quarantined"] == 1.0


def test_host_loss_is_canopy_loss_at_ratio_one():
  # The host's GRPO loss on turn rows (token-mean, k3 to the base, old_logp = logp: one update
  # per batch) has CANOPY's gradient: same pooled normaliser, same KL, ratio 1.
  rng = np.random.default_rng(0)
  b, g, la = 2, 3, 5
  lengths = [[2, 1, 3], [1, 2, 2]]  # turns per episode
  rewards = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], np.float32)
  valid = np.ones((b, g), bool)
  adv = np.array(_population_adv(rewards.tolist(), valid.tolist()), np.float32)
  rows = [(i, j) for i in range(b) for j in range(g) for _ in range(lengths[i][j])]
  n = len(rows)
  ntok = rng.integers(1, la + 1, size=n)
  mask = np.arange(la)[None] < ntok[:, None]
  logp = jnp.asarray(-rng.uniform(0.1, 2.0, (n, la)).astype(np.float32))
  base = jnp.asarray(-rng.uniform(0.1, 2.0, (n, la)).astype(np.float32))
  beta = 0.3
  batch = dict(adv=jnp.asarray([adv[i, j] for i, j in rows]), weight=jnp.ones(n),
               loss_mask=jnp.asarray(mask), ref_logp=base,
               num_tokens=jnp.asarray(mask.sum(), jnp.float32),
               num_sequences=jnp.asarray(n, jnp.float32))

  def host(lp):
    return rtpo.batch_loss(lp, dict(batch, old_logp=jax.lax.stop_gradient(lp)), loss="grpo",
                           loss_kwargs=dict(loss_agg_mode="token-mean", epsilon_low=0.2,
                                            epsilon_high=0.2, beta=beta, kl_estimator="k3"))[0]

  # The same tokens in CANOPY's [B, G, T] layout: each episode's turns end to end.
  t = la * 3
  where = np.zeros((b, g), int)
  index = np.zeros((n, la, 3), int)
  cmask = np.zeros((b, g, t), bool)
  for r, (i, j) in enumerate(rows):
    for c in range(int(ntok[r])):
      index[r, c] = (i, j, where[i, j])
      cmask[i, j, where[i, j]] = True
      where[i, j] += 1

  def to_groups(x):
    out = jnp.zeros((b, g, t))
    for r in range(n):
      for c in range(int(ntok[r])):
        out = out.at[tuple(index[r, c])].set(x[r, c])
    return out

  def canopy(lp):
    return canopy_loss(to_groups(lp), to_groups(base), jnp.asarray(rewards), jnp.asarray(cmask),
                       jnp.asarray(valid), beta=beta)[0]

  np.testing.assert_allclose(jax.grad(host)(logp), jax.grad(canopy)(logp), rtol=1e-5, atol=1e-7)


def test_canopy_group_size_rule():
  config = stage_credit.CanopyConfig()
  metrics = stage_credit.check_canopy_group_size(32, 0.05, config=config)
  assert metrics["canopy/min_group_size"] == 32
  assert metrics["canopy/pilot_coverage"] == pytest.approx(1 - 0.95**32 - 0.05**32)
  with pytest.raises(ValueError, match=r"config\.group_size=8 .*group_size >= 32"):
    stage_credit.check_canopy_group_size(8, 0.05, config=config)
  # P_sig is symmetric: a 95 % pilot needs as large a group as a 5 % one.
  with pytest.raises(ValueError, match=r"config\.group_size=8"):
    stage_credit.check_canopy_group_size(8, 0.95, config=config)
  with pytest.raises(ValueError, match=r"config\.group_size=64: the pilot's success rate"):
    stage_credit.check_canopy_group_size(64, 0.0, config=config)
  lenient = stage_credit.CanopyConfig(enforce_group_size=False)
  assert stage_credit.check_canopy_group_size(8, 0.05, config=lenient)[
    "canopy/min_group_size"] == 32
  assert stage_credit.check_canopy_group_size(8, 1.0, config=lenient)[
    "canopy/min_group_size"] == -1
  with pytest.raises(ValueError, match="pilot_success"):
    stage_credit.check_canopy_group_size(8, 1.5)


def test_canopy_config_and_protocol_errors():
  loss = dict(name="grpo", loss_agg_mode="token-mean", beta=1e-4, kl_estimator="k3")
  stage_credit.check_canopy_protocol(loss, ppo_epochs=1, ppo_mini_batches=1)
  with pytest.raises(ValueError, match=r"config\.ppo_mini_batches=2"):
    stage_credit.check_canopy_protocol(loss, ppo_epochs=1, ppo_mini_batches=2)
  with pytest.raises(ValueError, match=r"config\.ppo_epochs=2"):
    stage_credit.check_canopy_protocol(loss, ppo_epochs=2, ppo_mini_batches=1)
  with pytest.raises(ValueError, match=r"config\.loss\.name='rtpo'"):
    stage_credit.check_canopy_protocol(dict(loss, name="rtpo"), ppo_epochs=1, ppo_mini_batches=1)
  with pytest.raises(ValueError, match="unknown config.canopy keys"):
    stage_credit.CanopyConfig.from_config(dict(target=0.8))
  with pytest.raises(ValueError, match=r"config\.canopy\.fault_errors"):
    stage_credit.CanopyConfig(fault_errors=("oom",))
  with pytest.raises(ValueError, match=r"config\.canopy\.coverage_target"):
    stage_credit.CanopyConfig(coverage_target=1.0)
  with pytest.raises(ValueError, match=r"config\.canopy\.pilot_episodes"):
    stage_credit.CanopyConfig(pilot_episodes=0)


def test_modes_are_turn_grpo_hooks():
  assert {"temporal_grpo", "stage_reward", "canopy"} <= set(rtpo.MODES)
  assert set(rtpo.HOOK_MODES) >= {"ocsd", "temporal_grpo", "stage_reward", "canopy"}
