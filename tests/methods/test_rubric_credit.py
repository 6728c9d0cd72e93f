"""DRACO as a turn-GRPO batch hook (methods.rubric_credit): the stand-in judge's verdicts and
citations, the rubric reward, step credit per turn row, leniency, and config errors."""

import dataclasses
import doctest

import jax
import ml_collections
import numpy as np
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.envs import get_env, identity
from jaxrl_post.methods import rtpo, rubric_credit
from jaxrl_post.methods.rubric_credit import (
  NO_FAILED_ACTION,
  NO_REPEATED_CALL,
  RubricConfig,
  RubricCredit,
  Verdict,
  judge_episode,
)
from jaxrl_post.rewards.rubrics import FAIL, NOT_APPLICABLE, PASS
from jaxrl_post.sampling import FINISH_STOP, multiturn
from jaxrl_post.sampling.multiturn import Generation

TOK = multiturn.build_tokenizer("char_tools")
KV = get_env("kv_lookup", horizon=2, num_keys=8)  # 3 stages; max_turns = 2 + 1 + 1 = 4
G = 4


def test_doctests():
  assert doctest.testmod(rubric_credit, raise_on_error=False).failed == 0


# ---- scripted players: one fixed list of actions per episode ----


def _scripts(index):
  """Four behaviours on episode `index` of kv_lookup (chain k1 → k2 → number)."""
  demo = list(KV.make_episode("train", index).demonstration)  # get(k1), get(k2), answer
  wrong = "<answer>0</answer>"
  return [
    demo,  # 0: every stage, clean
    [demo[0], demo[0], demo[1], wrong],  # 1: a repeated call, then a wrong answer
    ["oops", demo[0], wrong],  # 2: a format error, hop 1, a wrong answer
    ["<tool>get(zzz)</tool>", wrong],  # 3: an unknown key, a wrong answer
  ]


@dataclasses.dataclass
class Script:
  actions: list

  def __call__(self, contexts, rng):
    del rng
    assert len(contexts) == 1
    ids = np.asarray(TOK.encode(self.actions.pop(0)), np.int32)
    return [Generation(ids, np.full(len(ids), -0.5, np.float32), FINISH_STOP)]


def _play(index, scripts=None):
  out = []
  for script in scripts or _scripts(index):
    out += multiturn.rollout(KV, [KV.initial_state(index)], Script(list(script)), tokenizer=TOK,
                             context=identity(), max_context_len=256, rng=jax.random.key(0))
  return out


@dataclasses.dataclass(frozen=True)
class FakeState:
  params: int


@dataclasses.dataclass
class FakeBackend:
  """`rtpo.Backend` that plays the scripts of each start's episode; records the PPO batch."""

  batches: list = dataclasses.field(default_factory=list)
  trajectories: list = dataclasses.field(default_factory=list)

  def rollout(self, params, starts, rng, *, greedy=False):
    assert len(starts) % G == 0
    out = []
    for i in range(0, len(starts), G):
      out += _play(starts[i].episode.index)
    self.trajectories.append(out)
    return out

  def turn_batch(self, turns, adv, weight=None):
    return multiturn.turn_batch(turns, adv, pad_id=TOK.pad_id, context_len=256, action_len=24,
                                weight=weight)

  def flat_batch(self, trajectories, adv):
    raise AssertionError("DRACO trains turn rows")

  def score(self, params, batch):
    raise AssertionError("DRACO does not score")

  def ppo(self, state, batch, *, rng):
    self.batches.append(batch)
    return FakeState(state.params + 1), {"loss": 0.0, "num_updates": 1.0}


def _step(hook, prompts=2):
  backend = FakeBackend()
  method = rtpo.MethodConfig(method=rtpo.OCSD_HOST, group_size=G)
  out = rtpo.grpo_step(FakeState(0), backend, [KV.initial_state(i) for i in range(prompts)],
                       config=method, rng=jax.random.key(0), shuffle=np.random.default_rng(0),
                       batch_hook=hook)
  return out, backend


# ---- independent numpy references ----


def _grpo(r, eps=1e-6):
  r = np.asarray(r, np.float64)
  return (r - r.mean()) / (r.std(ddof=1) + eps)


def _redistribute(a, q_cited, tokens):
  """DRACO's closed form by the paper's definitions, one rollout, with loops. `q_cited[j]` is
  (p_j, f_j) or None for an uncited step."""
  qs = [p / (p + f) for p, f in (c for c in q_cited if c is not None)]
  if not qs:
    return [a] * len(tokens)
  q_bar = sum(qs) / len(qs)
  q = [(c[0] / (c[0] + c[1])) if c is not None else q_bar for c in q_cited]
  w = [qj if a >= 0 else 1 - qj for qj in q]
  if sum(w) <= 1e-8:
    return [a] * len(tokens)
  total = sum(tokens)
  return [a * total * wj / (nj * sum(w)) for wj, nj in zip(w, tokens, strict=True)]


# ---- the judge ----


def test_judge_verdicts_and_citations_by_hand():
  trajs = _play(0)
  assert [len(t.turns) for t in trajs] == [3, 4, 3, 2]
  assert [t.success for t in trajs] == [True, False, False, False]
  judged = [judge_episode(KV, t) for t in trajs]
  assert judged[0] == {"stage_1": Verdict(PASS, (0,)), "stage_2": Verdict(PASS, (1,)),
                       "stage_3": Verdict(PASS, (2,)), NO_FAILED_ACTION: Verdict(PASS),
                       NO_REPEATED_CALL: Verdict(PASS)}
  # Hop 1 at turn 0 (turn 1 repeats it), hop 2 at turn 2, the wrong answer at turn 3.
  assert judged[1] == {"stage_1": Verdict(PASS, (0,)), "stage_2": Verdict(PASS, (2,)),
                       "stage_3": Verdict(FAIL, (3,)), NO_FAILED_ACTION: Verdict(PASS),
                       NO_REPEATED_CALL: Verdict(FAIL, (1,))}
  # Hop 2 is failed by the turns after hop 1 (the answer); the answer stage was never reached.
  assert judged[2] == {"stage_1": Verdict(PASS, (1,)), "stage_2": Verdict(FAIL, (2,)),
                       "stage_3": Verdict(NOT_APPLICABLE), NO_FAILED_ACTION: Verdict(FAIL, (0,)),
                       NO_REPEATED_CALL: Verdict(PASS)}
  assert judged[3] == {"stage_1": Verdict(FAIL, (0, 1)), "stage_2": Verdict(NOT_APPLICABLE),
                       "stage_3": Verdict(NOT_APPLICABLE), NO_FAILED_ACTION: Verdict(FAIL, (0,)),
                       NO_REPEATED_CALL: Verdict(PASS)}
  # A rollout without tool calls: the repeat criterion does not apply.
  answer_only = judge_episode(KV, _play(0, [["<answer>1</answer>"]])[0])
  assert answer_only[NO_REPEATED_CALL] == Verdict(NOT_APPLICABLE)
  assert answer_only["stage_1"] == Verdict(FAIL, (0,))


def test_group_rubric_is_dynamic_only_in_draco_mode():
  judged = [judge_episode(KV, t) for t in _play(0)]
  assert rubric_credit.group_rubric(judged, 3) == [
    "stage_1", "stage_2", "stage_3", NO_FAILED_ACTION, NO_REPEATED_CALL]
  assert rubric_credit.group_rubric(judged[:1], 3) == ["stage_1", "stage_2", "stage_3"]
  assert rubric_credit.group_rubric(judged, 3, dynamic=False) == ["stage_1", "stage_2",
                                                                  "stage_3"]


# ---- the hook on the host ----


def test_draco_rewards_and_step_credit_by_hand():
  out, backend = _step(RubricCredit(env=KV, group_size=G))
  trajs = backend.trajectories[0]
  batch = backend.batches[0]
  # p/f per rollout over the 5 kept criteria (every one is failed by someone): by hand above.
  rewards = [1.0, (3 - 2) / 5, 0.0, (1 - 2) / 3]
  assert out.metrics["draco/reward_mean"] == pytest.approx(np.mean(rewards), abs=1e-6)
  assert out.metrics["draco/criteria"] == 5 and out.metrics["draco/kept"] == 5
  adv = _grpo(rewards)
  # The (p_j, f_j) citing each turn, from the verdicts above.
  cites = [[(1, 0), (1, 0), (1, 0)],
           [(1, 0), (0, 1), (1, 0), (0, 1)],
           [(0, 1), (1, 0), (0, 1)],
           [(0, 2), (0, 1)]]
  expected = []
  # Both prompts play the same behaviours, so both groups get the same rewards.
  for traj, a, c in zip(trajs, [*adv, *adv], cites * 2, strict=True):
    expected += _redistribute(a, c, [len(t.action_ids) for t in traj.turns])
  n = batch.num_rows
  assert n == sum(len(t.turns) for t in trajs) == 24
  np.testing.assert_allclose(batch.adv[:n], expected, rtol=1e-5, atol=1e-6)
  # Conservation per rollout: Σ_j n_j a_j = A_i N_i.
  row = 0
  for traj, a in zip(trajs, [*adv, *adv], strict=True):
    tokens = np.array([len(t.action_ids) for t in traj.turns])
    assert (tokens * batch.adv[row:row + len(tokens)]).sum() == pytest.approx(
      a * tokens.sum(), rel=1e-5)
    row += len(tokens)
  assert out.metrics["draco/fallback"] == 0
  assert out.metrics["draco/lenient_flips"] == 0
  assert out.metrics["train/num_updates"] == 1


def test_static_rubric_has_no_dropout_and_no_step_credit():
  hook = RubricCredit(env=KV, group_size=G, mode=rubric_credit.DRACO_STATIC)
  out, backend = _step(hook, prompts=1)
  trajs, batch = backend.trajectories[0], backend.batches[0]
  rewards = [1.0, 1 / 3, 0.0, -1.0]  # stage criteria only
  adv = _grpo(rewards)
  expected = [a for traj, a in zip(trajs, adv, strict=True) for _ in traj.turns]
  np.testing.assert_allclose(batch.adv[:batch.num_rows], expected, rtol=1e-5, atol=1e-6)
  assert out.metrics["draco/criteria"] == 3 and "draco/fallback" not in out.metrics


def test_dropout_removes_criteria_nobody_fails():
  # Two clean rollouts and two that only fail the answer: the hop criteria are dropped, so
  # the rewards are ±1 from the answer stage alone.
  demo = list(KV.make_episode("train", 0).demonstration)
  scripts = [demo, demo, demo[:2] + ["<answer>0</answer>"], demo[:2] + ["<answer>9</answer>"]]
  trajs = _play(0, scripts)
  batch = multiturn.turn_batch([t for tr in trajs for t in tr.turns], np.zeros(12),
                               pad_id=TOK.pad_id, context_len=256, action_len=24)
  out, metrics = RubricCredit(env=KV, group_size=G)(None, trajs, batch)
  assert metrics["draco/criteria"] == 3 and metrics["draco/kept"] == 1
  assert metrics["draco/reward_mean"] == 0
  adv = _grpo([1, 1, -1, -1])
  # Only the answer turn is cited: Q = 1 (good rollouts) or 0 (bad); the hops get the cited
  # mean, so all weight is w = 1 everywhere and a_j = A_i N / (3 n_j).
  expected = []
  for traj, a in zip(trajs, adv, strict=True):
    tokens = [len(t.action_ids) for t in traj.turns]
    expected += [a * sum(tokens) / (3 * n) for n in tokens]
  np.testing.assert_allclose(out.adv[:12], expected, rtol=1e-5)


def test_leniency_is_seeded_by_step():
  full = RubricCredit(env=KV, group_size=G, config=RubricConfig(leniency=1.0))
  out, backend = _step(full, prompts=1)
  # Every FAIL judged PASS: nothing is discriminative, all rewards 0, the step is skipped.
  assert out.metrics["draco/lenient_flips"] == 1.0 and out.metrics["draco/kept"] == 0
  assert out.metrics["train/num_updates"] == 0 and not backend.batches
  half = RubricCredit(env=KV, group_size=G, config=RubricConfig(leniency=0.5), seed=3)
  first = _step(half.at_step(5))[1].batches[0].adv
  again = _step(half.at_step(5))[1].batches[0].adv
  np.testing.assert_array_equal(first, again)
  others = [_step(half.at_step(s))[1].batches for s in range(6, 9)]
  assert any(not b or not np.array_equal(b[0].adv, first) for b in others)


# ---- errors ----


def test_config_errors_name_the_key():
  with pytest.raises(ValueError, match="config.draco.leniency"):
    RubricConfig(leniency=1.5)
  with pytest.raises(ValueError, match="config.draco.eps"):
    RubricConfig(eps=-1.0)
  with pytest.raises(ValueError, match=r"unknown config.draco keys \['lenency'\]"):
    RubricConfig.from_config({"lenency": 0.1})
  with pytest.raises(ValueError, match="mode='dracoo'"):
    RubricCredit(env=KV, group_size=G, mode="dracoo")
  with pytest.raises(ValueError, match="group_size"):
    RubricCredit(env=KV, group_size=1)
  hook = RubricCredit(env=KV, group_size=G)
  trajs = _play(0)
  batch = multiturn.turn_batch([t for tr in trajs for t in tr.turns][:-1], np.zeros(11),
                               pad_id=TOK.pad_id, context_len=256, action_len=24)
  with pytest.raises(ValueError, match="turn rows"):
    hook(None, trajs, batch)
  with pytest.raises(ValueError, match="group_size=4"):
    hook(None, trajs[:3], batch)


def test_binary_rejects_a_bad_draco_knob_before_building_the_model():
  config = load_module(rtpo.__file__.replace("jaxrl_post/methods/rtpo.py", "configs/draco.py")
                       ).get_config("runlocal,horizon=2")
  config.draco.leniency = 2.0
  with pytest.raises(ValueError, match="config.draco.leniency"):
    rtpo.RTPO(config).build_model(None)
  config.draco = ml_collections.ConfigDict({"leniency": 0.0, "temperature": 1.0})
  with pytest.raises(ValueError, match="unknown config.draco keys"):
    rtpo.RTPO(config).build_model(None)
