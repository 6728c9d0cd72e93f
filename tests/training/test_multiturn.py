"""Multi-turn rollouts, turn / flat batches, the consistency metric, and the three method steps."""

import dataclasses
import doctest
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post.envs import Env, Episode, get_env, identity, tools, truncate
from jaxrl_post.envs.context import turn_to_tokens
from jaxrl_post.methods import rtpo
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import FINISH_STOP, multiturn
from jaxrl_post.sampling.multiturn import Generation
from jaxrl_post.tokenizers import CharTokenizer
from jaxrl_post.training.train_state import create_train_state

TOK = multiturn.build_tokenizer("char_tools")  # `</tool>` and `</answer>` are single tokens
KV = get_env("kv_lookup", horizon=3, num_keys=8)


def test_doctests():
  assert doctest.testmod(multiturn, raise_on_error=False).failed == 0


# ---- scripted policies ----


def _oracle_action(context_text: str) -> str:
  """kv_lookup's optimal next action, read off the context: follow the last key seen."""
  last = context_text.rsplit("<obs>", 1)
  if len(last) == 1:  # no observation yet: the prompt names the first key
    return f"<tool>get({context_text.split('from ')[1].split(' ')[0]})</tool>"
  value = last[1].split("</obs>")[0]
  return f"<answer>{value}</answer>" if value.isdigit() else f"<tool>get({value})</tool>"


@dataclasses.dataclass
class ScriptedPolicy:
  """Plays `_oracle_action`, or with probability `slip` (per row, from `rng`) a wrong answer."""

  slip: float = 0.0
  actions: dict | None = None  # context text → action, overriding the oracle
  calls: list = dataclasses.field(default_factory=list)

  def __call__(self, contexts, rng):
    self.calls.append([np.asarray(c).copy() for c in contexts])
    draws = np.asarray(jax.random.uniform(rng, (len(contexts),)))
    out = []
    for ids, u in zip(contexts, draws, strict=True):
      text = TOK.decode(ids, skip_special=False)
      action = (self.actions or {}).get(text) or (
        "<answer>0</answer>" if u < self.slip else _oracle_action(text))
      action_ids = np.asarray(TOK.encode(action), np.int32)
      # Deterministic made-up log-probs, so equality checks cover them too.
      out.append(Generation(action_ids, -0.01 * np.arange(1, len(action_ids) + 1, dtype=np.float32),
                            FINISH_STOP))
    return out


def _rollout(env, starts, policy, rng=0, context=None, max_context_len=256):
  return multiturn.rollout(env, starts, policy, tokenizer=TOK, context=context or identity(),
                           max_context_len=max_context_len, rng=jax.random.key(rng))


# ---- rollouts ----


def test_batched_rollout_matches_the_env_and_records_exact_tokens():
  starts = [KV.initial_state(i) for i in range(4)]
  trajectories = _rollout(KV, starts, ScriptedPolicy())
  for i, traj in enumerate(trajectories):
    assert traj.success and traj.reward == 1.0 and len(traj.turns) == 4
    assert traj.trajectory().actions == KV.demonstration("train", i)
    for t in traj.turns:
      # The recorded ids are the ones the envs' own token view gives (segment by segment).
      arrays = turn_to_tokens(t.turn, TOK, None)
      expected = np.concatenate([t.context_ids, t.action_ids])
      np.testing.assert_array_equal(arrays.tokens, expected)
      assert TOK.decode(t.context_ids, skip_special=False) == t.turn.context_text
  stats = multiturn.rollout_stats(trajectories)
  assert stats["success"] == 1.0 and stats["turns"] == 4.0 and stats["tool_calls"] == 3.0
  assert stats["generated_tokens"] == sum(t.num_generated_tokens for t in trajectories)


def test_failing_and_hanging_tools_are_error_observations_inside_a_batch():
  @dataclasses.dataclass(kw_only=True)
  class FlakyEnv(Env):
    name = "kv_lookup"  # reuses a registered name: snapshots check it

    def make_episode(self, split, index):
      return Episode(env=self.name, split=split, index=index, prompt=f"go {index}\n",
                     answer="ok", max_turns=self.max_turns)

    def tools(self, episode):
      def boom(arg):
        raise RuntimeError(arg)

      def hang(arg):
        time.sleep(30)

      return {"echo": lambda arg: arg, "boom": boom, "hang": hang}

    def score(self, episode, answer):
      return float(answer == "ok")

  env = FlakyEnv(horizon=1, spare_turns=1, tool_timeout_s=0.2)
  starts = [env.initial_state(i) for i in range(3)]
  first = {"go 0\n": "<tool>echo(hi)</tool>", "go 1\n": "<tool>boom(x)</tool>",
           "go 2\n": "<tool>hang(x)</tool>"}
  actions = dict(first)
  for prompt, action in first.items():  # every episode answers on its second turn
    for obs in ("\n<obs>hi</obs>\n", "\n<obs>error: tool failed: RuntimeError</obs>\n",
                "\n<obs>error: tool timed out after 0.2s</obs>\n"):
      actions[prompt + action + obs] = "<answer>ok</answer>"
  tic = time.monotonic()
  trajectories = _rollout(env, starts, ScriptedPolicy(actions=actions))
  assert time.monotonic() - tic < 5.0  # the hang was cut at 0.2 s
  observations = [traj.turns[0].turn.observation for traj in trajectories]
  assert observations == ["\n<obs>hi</obs>\n", "\n<obs>error: tool failed: RuntimeError</obs>\n",
                          "\n<obs>error: tool timed out after 0.2s</obs>\n"]
  errors = [traj.turns[0].turn.info["error"] for traj in trajectories]
  assert errors == [None, tools.ERROR_EXCEPTION, tools.ERROR_TIMEOUT]
  # The failures are the model's problem, not the batch's: every episode went on and answered.
  assert all(traj.success and len(traj.turns) == 2 for traj in trajectories)


def test_forked_siblings_are_deterministic_and_leave_the_trunk_alone():
  trunk = _rollout(KV, [KV.initial_state(5)], ScriptedPolicy())[0]
  k = 2
  snapshot = trunk.turns[k].snapshot
  before = dataclasses.replace(snapshot)
  policy = ScriptedPolicy(slip=0.5)
  a = _rollout(KV, [snapshot] * 4, policy, rng=7)
  b = _rollout(KV, [snapshot] * 4, policy, rng=7)
  assert snapshot == before and trunk.turns[k].snapshot is snapshot
  for x, y in zip(a, b, strict=True):
    assert x.trajectory().actions == y.trajectory().actions and x.final_state == y.final_state
    np.testing.assert_array_equal(x.turns[0].logp, y.turns[0].logp)
    # A sibling starts from the trunk's very context c_k.
    np.testing.assert_array_equal(x.turns[0].context_ids, trunk.turns[k].context_ids)
    assert x.turns[0].index == k
  assert len({s.reward for s in a}) == 2  # the slips made some siblings fail
  # Replaying the trunk's own actions from S_k reproduces its turns and final state exactly.
  replay = {TOK.decode(t.context_ids, skip_special=False): t.turn.action for t in trunk.turns}
  again = _rollout(KV, [snapshot], ScriptedPolicy(actions=replay))[0]
  assert [t.turn for t in again.turns] == [t.turn for t in trunk.turns[k:]]
  assert again.final_state == trunk.final_state


# ---- batches ----


def test_turn_and_flat_batches_train_actions_only():
  # The prompt (38 tokens) and the newest 26 tokens: the last observation and part of an action.
  psi = truncate(64, tokenizer=TOK, keep_prompt=True)
  trajectories = _rollout(KV, [KV.initial_state(i) for i in range(2)], ScriptedPolicy(),
                          context=psi)
  assert all(traj.success for traj in trajectories)
  turns = [t for traj in trajectories for t in traj.turns]
  batch = multiturn.turn_batch(turns, np.arange(len(turns)), pad_id=TOK.pad_id, context_len=64,
                               action_len=24, rows=10)
  assert batch.num_rows == len(turns) == 8 and batch.adv.shape == (10,)
  for i, t in enumerate(turns):
    # The context is the recorded (truncated) c_k, verbatim; the loss covers exactly a_k.
    np.testing.assert_array_equal(batch.prompt_tokens[i][batch.prompt_mask[i]], t.context_ids)
    assert TOK.decode(batch.completion_tokens[i][batch.loss_mask[i]],
                      skip_special=False) == t.turn.action
    assert set(batch.turn_ids[i][batch.loss_mask[i]]) == {t.index} and batch.turn[i] == t.index
  assert not batch.loss_mask[8:].any() and batch.prompt_mask[8:, -1].all()

  flat, num_cut = multiturn.flat_batch(trajectories, [1.0, -1.0], tokenizer=TOK, prompt_len=64,
                                       completion_len=160)
  assert num_cut == 0
  for i, traj in enumerate(trajectories):
    row = flat.completion_tokens[i]
    # Trained tokens are the actions in order; everything else is observation text.
    assert TOK.decode(row[flat.loss_mask[i]], skip_special=False) == "".join(
      traj.trajectory().actions)
    untrained = flat.completion_mask[i] & ~flat.loss_mask[i]
    assert TOK.decode(row[untrained], skip_special=False) == "".join(
      t.turn.observation for t in traj.turns)
    # The flat view is the whole history, longer than the truncated contexts the rollout saw.
    assert flat.completion_mask[i].sum() + flat.prompt_mask[i].sum() > max(
      len(t.context_ids) + len(t.action_ids) for t in traj.turns)
  with pytest.raises(ValueError, match="exceed the batch widths"):
    multiturn.turn_batch(turns, np.zeros(8), pad_id=0, context_len=8, action_len=24)


def test_observation_tokens_never_get_gradient():
  trajectories = _rollout(KV, [KV.initial_state(i) for i in range(2)], ScriptedPolicy())
  flat, _ = multiturn.flat_batch(trajectories, [1.0, -0.5], tokenizer=TOK, prompt_len=32,
                                 completion_len=160)
  rng = np.random.default_rng(0)
  old = rng.normal(-1.0, 0.3, flat.loss_mask.shape).astype(np.float32)
  # Garbage (huge ratios) at observation positions: were they read, the loss would explode.
  old = np.where(flat.loss_mask, old, 50.0).astype(np.float32)
  arrays = dict(flat.arrays(), old_logp=old, num_tokens=np.float32(flat.loss_mask.sum()),
                num_sequences=np.float32(2))
  logp = rng.normal(-1.0, 0.3, old.shape).astype(np.float32)
  # GRPO on the flat view: every action token is trained, no observation token is.
  # RTPO on the same rows, training turn 1 of row 0 and turn 2 of row 1: only those tokens.
  turn = np.array([1, 2], np.int32)
  for loss, trained in (("grpo", flat.loss_mask),
                        ("rtpo", flat.loss_mask & (flat.turn_ids == turn[:, None]))):
    batch = dict(arrays, turn=turn)
    fn = jax.jit(jax.value_and_grad(lambda lp, b=batch, loss=loss: rtpo.batch_loss(
      lp, b, loss=loss)[0]))
    value, grad = fn(logp)
    grad = np.asarray(grad)
    assert np.isfinite(value) and np.all(grad[~trained] == 0.0)
    assert np.count_nonzero(grad[trained]) > trained.sum() // 2


# ---- the model side: consistency, scoring, updates ----


@pytest.fixture(scope="module")
def learner_and_state():
  model = CausalLM(get_model_config("tiny", vocab_size=TOK.vocab_size), rngs=nnx.Rngs(0))
  optimizer = optax.adam(1e-3)
  psi = truncate(48, tokenizer=TOK, keep_prompt=True)
  learner = rtpo.Learner(model, TOK, optimizer, env=KV, context=psi, loss="rtpo",
                         max_turn_tokens=16, max_context_len=96, flat_len=128,
                         sampler_batch_buckets=(8,), sampler_len_buckets=(96,),
                         bucket_widths=False)
  return learner, create_train_state(model, optimizer, jax.random.key(0))


def test_consistency_is_one_on_recorded_contexts_and_not_on_the_flat_history(learner_and_state):
  learner, state = learner_and_state
  trajectories = learner.rollout(state.params, [KV.initial_state(i) for i in range(6)],
                                 jax.random.key(3))
  turns = [t for traj in trajectories for t in traj.turns][:8]
  assert len({t.index for t in turns}) > 1 and any(t.context_cut or len(t.context_ids) == 48
                                                   for t in turns)
  batch = learner.turn_batch(turns, np.zeros(len(turns)))
  check = multiturn.consistency(learner.score(state.params, batch), batch.rollout_logp,
                                batch.loss_mask)
  np.testing.assert_allclose(check.ratio, 1.0, atol=1e-4)
  assert check.abs_diff_max < 1e-3 and abs(check.kl) < 1e-6
  # The flat view re-reads the full history the truncating ψ hid from the rollout.
  long = [t for t in trajectories if len(t.turns) > 2][:2]
  flat, _ = learner.flat_batch(long, np.zeros(len(long)))
  mismatch = multiturn.consistency(learner.score(state.params, flat), flat.rollout_logp,
                                   flat.loss_mask)
  assert abs(float(mismatch.ratio) - 1.0) > 1e-3 and mismatch.abs_diff_max > 1e-2


def test_host_side_stop_strings_with_a_plain_character_tokenizer():
  tok = CharTokenizer()
  assert multiturn.stop_token_ids(tok) == [] and multiturn.stop_token_ids(TOK) == [3, 4]
  ids = tok.encode("x <answer>7</answer> junk")
  assert multiturn.stop_cut(ids, tok, tools.STOP_STRINGS) == len("x <answer>7</answer>")
  assert multiturn.stop_cut(tok.encode("no end"), tok, tools.STOP_STRINGS) is None
  assert multiturn.action_text([*TOK.encode("<answer>1</answer>"), TOK.eos_id], TOK) == (
    "<answer>1</answer>")


def test_ppo_phase_updates_without_recompiling(learner_and_state):
  learner, state = learner_and_state
  trajectories = _rollout(KV, [KV.initial_state(i) for i in range(2)], ScriptedPolicy(),
                          context=learner.context, max_context_len=96)
  turns = [t for traj in trajectories for t in traj.turns]
  before = jax.tree.map(np.asarray, state.params)
  for n in (8, 7):  # 7 rows pad to the same 8-row bucket: one compiled update
    batch = learner.turn_batch(turns[:n], np.linspace(-1, 1, n))
    state, metrics = learner.ppo(state, batch, rng=np.random.default_rng(n))
    assert metrics["num_updates"] == 1 and metrics["skipped"] == 0
    # The scripted log-probs are not the model's: the metric sees the mismatch.
    assert metrics["consistency_ratio"] != pytest.approx(1.0)
  assert learner.ppo_step._cache_size() == 1
  changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, state.params)
  assert any(jax.tree.leaves(changed))


def test_skipped_zero_advantage_rows_keep_the_full_batch_gradient():
  # RTPO skips siblings whose advantage is 0 (arXiv 2608.18682), which must not change the
  # gradient. Under plain SGD an update is −lr·∇: the update on the kept rows, with the
  # skipped rows still in the normalisers, must equal the update on the full batch, where the
  # zero-advantage rows contribute exactly 0. Without them in the normalisers it is the full
  # batch's scaled by num_sequences(full) / num_sequences(kept) = 1 / (1 − zero-adv rate).
  model = CausalLM(get_model_config("tiny", vocab_size=TOK.vocab_size), rngs=nnx.Rngs(0))
  sgd = optax.sgd(1e3)  # large steps, so params' float32 rounding does not hide the update
  learner = rtpo.Learner(model, TOK, sgd, env=KV, context=identity(), loss="rtpo",
                         max_turn_tokens=16, max_context_len=96, flat_len=128,
                         bucket_widths=False)
  state = create_train_state(model, sgd, jax.random.key(0))
  psi = truncate(48, tokenizer=TOK, keep_prompt=True)
  trajectories = _rollout(KV, [KV.initial_state(i) for i in range(2)], ScriptedPolicy(),
                          context=psi, max_context_len=96)
  turns = [t for traj in trajectories for t in traj.turns][:6]
  adv = np.array([0.5, -0.5, 0.0, 0.0, 0.0, 0.0], np.float32)  # 4 of 6 rows: zero advantage
  keep = adv != 0

  def delta(batch, skipped=None):
    new, _ = learner.ppo(jax.tree.map(jnp.copy, state), batch, rng=np.random.default_rng(0),
                         skipped=skipped)
    return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new.params, state.params)

  full = delta(learner.turn_batch(turns, adv))
  kept_turns = [t for t, k in zip(turns, keep, strict=True) if k]
  skipped_turns = [t for t, k in zip(turns, keep, strict=True) if not k]
  kept = delta(learner.turn_batch(kept_turns, adv[keep]),
               learner.turn_batch(skipped_turns, np.zeros(len(skipped_turns))))
  rescaled = delta(learner.turn_batch(kept_turns, adv[keep]))  # the old, buggy normaliser
  leaves = list(zip(jax.tree.leaves(full), jax.tree.leaves(kept), jax.tree.leaves(rescaled),
                    strict=True))
  scale = max(np.abs(f).max() for f, _, _ in leaves)
  assert scale > 1e-3  # a real update
  for f, k, r in leaves:
    np.testing.assert_allclose(k, f, rtol=1e-3, atol=1e-4 * scale)
    np.testing.assert_allclose(r, 3.0 * f, rtol=1e-3, atol=3e-4 * scale)  # 6 / 2 sequences


# ---- the method steps ----


@dataclasses.dataclass(frozen=True)
class FakeState:
  params: int  # a version counter standing for the parameters


@dataclasses.dataclass
class FakeBackend:
  """`Backend` with a scripted policy; the "parameters" are a version counter that each
  update increments, so the test can see which version sampled what."""

  policy: ScriptedPolicy
  context: object = None
  log: list = dataclasses.field(default_factory=list)

  def rollout(self, params, starts, rng, *, greedy=False):
    out = multiturn.rollout(KV, starts, self.policy, tokenizer=TOK,
                            context=self.context or identity(), max_context_len=256, rng=rng)
    self.log.append(("rollout", params, [s.turn for s in starts], out))
    return out

  def turn_batch(self, turns, adv, weight=None):
    return multiturn.turn_batch(turns, adv, pad_id=0, context_len=256, action_len=24,
                                weight=weight)

  def flat_batch(self, trajectories, adv):
    return multiturn.flat_batch(trajectories, adv, tokenizer=TOK, prompt_len=64,
                                completion_len=256)

  def score(self, params, batch):
    return batch.rollout_logp[:batch.num_rows] + 0.1 * params  # drifts with each update

  def ppo(self, state, batch, *, rng, skipped=None):
    self.log.append(("ppo", state.params, batch, skipped))
    metrics = {"loss": 0.0, "num_updates": 1.0, "nonfinite_streak": 0.0, "skipped": 0.0}
    return FakeState(state.params + 1), metrics


def _config(method, **kw):
  return rtpo.MethodConfig(method=method, group_size=3 if method == "rtpo" else 4, **kw)


def test_rtpo_sweeps_boundaries_last_to_first_with_updated_parameters():
  backend = FakeBackend(ScriptedPolicy(slip=0.3))
  starts = [KV.initial_state(i) for i in range(3)]
  out = rtpo.rtpo_step(FakeState(0), backend, starts, config=_config("rtpo", trunks_per_prompt=2),
                       rng=jax.random.key(0), shuffle=np.random.default_rng(0))
  rollouts = [entry for entry in backend.log if entry[0] == "rollout"]
  trunk, forks = rollouts[0], rollouts[1:]
  assert trunk[2] == [0] * 6  # 2 trunks per prompt, from the start
  depth = max(len(t.turns) for t in trunk[3])
  # Forks from the deepest boundary down to 0, every trunk that reached k forking G − 1 = 2.
  ks = [entry[2][0] for entry in forks]
  assert ks == list(range(depth - 1, -1, -1)) and [b["k"] for b in out.boundaries] == ks
  for k, entry in zip(ks, forks, strict=True):
    reached = sum(len(t.turns) > k for t in trunk[3])
    assert entry[2] == [k] * (2 * reached)
  # On-policy: boundary k samples with the parameters updated on every boundary after it.
  updates = 0
  for entry in backend.log:
    if entry[0] == "ppo":
      assert entry[1] == updates
      updates += 1
    elif entry is not trunk:
      assert entry[1] == updates
  assert out.state.params == updates == out.metrics["rtpo/boundaries_trained"] > 0
  # Each update trains one boundary's siblings' turn k, with sibling advantages R_j − mean.
  trained = [entry[2] for entry in backend.log if entry[0] == "ppo"]
  for batch, stats in zip(trained, [b for b in out.boundaries if b["trained"]], strict=True):
    assert set(batch.turn.tolist()) == {int(stats["k"])}
    adv = batch.adv.reshape(-1, 2)  # two siblings per kept boundary
    np.testing.assert_allclose(adv.sum(1), 0.0, atol=1e-6)
    assert np.all(np.abs(adv) == 0.5)  # binary rewards that differ: ±1/2
    assert np.all(batch.weight == 1.0)
  # The skipped (zero-advantage) siblings of a trained boundary go to the PPO phase too, for
  # its normalisers: kept + skipped = every sibling of the boundary (2 per trunk that reached k).
  for entry in [e for e in backend.log if e[0] == "ppo"]:
    k = int(entry[2].turn[0])
    reached = sum(len(t.turns) > k for t in trunk[3])
    skipped = entry[3]
    assert entry[2].num_rows + (skipped.num_rows if skipped is not None else 0) == 2 * reached
    if skipped is not None:
      assert np.all(skipped.adv[:skipped.num_rows] == 0.0)
      assert set(skipped.turn[:skipped.num_rows].tolist()) == {k}
  assert out.generated_tokens == sum(t.num_generated_tokens for e in rollouts for t in e[3])


def test_rtpo_skips_zero_advantage_boundaries():
  backend = FakeBackend(ScriptedPolicy(slip=0.0))  # every sibling succeeds: A ≡ 0
  out = rtpo.rtpo_step(FakeState(0), backend, [KV.initial_state(0)], config=_config("rtpo"),
                       rng=jax.random.key(0), shuffle=np.random.default_rng(0))
  assert not [e for e in backend.log if e[0] == "ppo"] and out.state.params == 0
  assert out.metrics["rtpo/zero_adv_rate"] == 1.0 and out.metrics["rtpo/boundaries_visited"] == 4
  # Without skipping, every boundary is trained (with zero advantages).
  backend = FakeBackend(ScriptedPolicy(slip=0.0))
  out = rtpo.rtpo_step(FakeState(0), backend, [KV.initial_state(0)],
                       config=_config("rtpo", skip_zero_advantage=False),
                       rng=jax.random.key(0), shuffle=np.random.default_rng(0))
  assert out.state.params == 4


def test_rtpo_off_policy_continuation_samples_once_and_weights():
  backend = FakeBackend(ScriptedPolicy(slip=0.3))
  out = rtpo.rtpo_step(FakeState(0), backend, [KV.initial_state(i) for i in range(3)],
                       config=_config("rtpo", continuation="off_policy", rho_max=1.5),
                       rng=jax.random.key(0), shuffle=np.random.default_rng(0))
  # Every fork was sampled by θ_0, before any update.
  assert all(entry[1] == 0 for entry in backend.log if entry[0] == "rollout")
  weights = [entry[2].weight for entry in backend.log if entry[0] == "ppo"]
  assert weights and out.state.params == len(weights)
  # FakeBackend.score adds 0.1·version per continuation token: ω̄ = clamp(e^{0.1·v·n}, 0.5, 1.5),
  # 1 for the first (deepest) trained boundary, where no update happened yet.
  np.testing.assert_allclose(weights[0], 1.0)
  assert all(np.all((w >= 1.0) & (w <= 1.5)) for w in weights)
  assert any(np.any(w > 1.0) for w in weights[1:])


@pytest.mark.parametrize("method", ["flat_grpo", "turn_grpo"])
def test_grpo_steps(method):
  backend = FakeBackend(ScriptedPolicy(slip=0.15))
  starts = [KV.initial_state(i) for i in range(2)]
  out = rtpo.grpo_step(FakeState(0), backend, starts, config=_config(method),
                       rng=jax.random.key(1),
                       shuffle=np.random.default_rng(0))
  ((_, _, batch, _),) = [e for e in backend.log if e[0] == "ppo"]
  (rollout,) = [e for e in backend.log if e[0] == "rollout"]
  assert rollout[2] == [0] * 8  # G = 4 episodes per prompt
  trajectories = rollout[3]
  if method == "flat_grpo":
    assert batch.num_rows == 8 and np.all(batch.turn == -1)
    episode_adv = batch.adv
  else:
    assert batch.num_rows == sum(len(t.turns) for t in trajectories)
    np.testing.assert_array_equal(batch.turn, [t.index for tr in trajectories for t in tr.turns])
    starts_of_episodes = np.cumsum([0] + [len(t.turns) for t in trajectories])[:-1]
    episode_adv = batch.adv[starts_of_episodes]
  # GRPO advantages of the episodes' returns: zero mean within each prompt's 4 episodes.
  np.testing.assert_allclose(episode_adv.reshape(2, 4).sum(1), 0.0, atol=1e-5)
  assert np.any(episode_adv != 0)
  assert out.generated_tokens == out.metrics["rollout/generated_tokens"] and out.state.params == 1
