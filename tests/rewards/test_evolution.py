"""The MLREF loop end to end: offline and LLM proposers, hostile modules, rollback, resume.

The "RL run" is a deterministic stand-in: a policy that concentrates on the states its reward
ranks highest (top fraction shrinking over T epochs) on a fixed sample of toy states, scored by a
hidden true objective (forward speed minus effort). Reward curves are the mean module outputs on
the visited states, as a PPO loop would log them from `RewardOutput.terms`.
"""

import json

import numpy as np
import pytest

from jaxrl_post.rewards import evolution as ev
from jaxrl_post.rewards import module_code
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards import proposers as pr
from jaxrl_post.rewards import sandbox as sb

FEATURES = {"v": (), "a": (2,)}
INFO = pr.TaskInfo(task="Run forward fast with little effort.", environment="Toy runner.",
                   feature_spec=FEATURES)
_RNG = np.random.default_rng(0)
STATES = {"v": _RNG.standard_normal(256).astype(np.float32),
          "a": _RNG.standard_normal((256, 2)).astype(np.float32)}
TRUE = STATES["v"] - 0.3 * np.sum(STATES["a"] ** 2, axis=-1)
CREDIT = mp.CreditConfig(smooth_window=4, diff_window=4, max_lag=2, k=3)


def toy_train(cand: ev.RewardCandidate) -> ev.TrainResult:
  out = cand.reward_fn()(STATES, cand.weights)  # Eager: op-by-op dispatch is cached; a jit
  # per candidate would compile a new program each time (a real PPO loop jits its whole step).
  order = np.argsort(-np.asarray(out.reward), kind="stable")
  terms = np.asarray(out.terms)
  perf, curves = [], [[] for _ in cand.modules]
  for t in range(24):
    visited = order[:int(256 * (1.0 - 0.8 * t / 23))]
    perf.append(TRUE[visited].mean())
    for i in range(len(cand.modules)):
      curves[i].append(terms[i, visited].mean())
  return ev.TrainResult(float(perf[-1]), np.array(perf),
                        {m.name: np.array(c) for m, c in zip(cand.modules, curves)})


@pytest.fixture(scope="module")
def vet_cache():
  """Verdicts shared by this module's runs: identical code is test-run once per worker."""
  return {}


def _config(root, **kw):
  return ev.EvolutionConfig(**{"iterations": 2, "num_variants": 2, "credit": CREDIT,
                               "vet": sb.VetConfig(root=root, per_module_s=10), **kw})


def test_offline_loop_rejects_hostile_modules(tmp_path, sandbox_root, vet_cache):
  outside = tmp_path / "outside"
  outside.mkdir()
  hostile = (
      mp.PlanOp(op="ADD", name="evil_import",
                code=f'import os\ndef evil_import(f):\n  os.remove("{outside}")\n  return f["v"]'),
      mp.PlanOp(op="ADD", name="evil_open",
                code=f'def evil_open(f):\n  return open("{outside}/pwned", "w") + f["v"]'),
      mp.PlanOp(op="ADD", name="evil_trick",
                code='def evil_trick(f):\n  return ().__class__.__base__.__subclasses__()'),
      mp.PlanOp(op="ADD", name="evil_nan", code='def evil_nan(f):\n  return jnp.sqrt(f["v"])'),
  )
  proposer = pr.OfflineProposer(pr.OfflineProposerConfig(seed=1, extra_ops=hostile))
  state = ev.evolve(INFO, proposer, toy_train, workdir=str(tmp_path / "wd"),
                    config=_config(sandbox_root), vet_cache=vet_cache)
  assert state.iteration == 2 and len(state.history) == 2
  assert mp.load_state(tmp_path / "wd").to_json() == state.to_json()
  assert list(outside.iterdir()) == []
  # Only vetted modules entered; every hostile proposal was recorded with its reason.
  for m in state.pool.modules:
    assert not m.name.startswith("evil")
    module_code.validate_module_code(m.code, FEATURES)
  rejected = {r.name: r for r in state.rejected}
  assert {"evil_import", "evil_open", "evil_trick", "evil_nan"} <= set(rejected)
  assert rejected["evil_import"].stage == "validate"
  assert rejected["evil_nan"].stage == "test-run" and "non-finite" in rejected["evil_nan"].reason
  # The rejections of round 1 were fed to the round-2 reflection.
  assert "evil_nan" in state.reflection and "Rejected modules" in state.reflection
  # R*: the best variant's selected modules and weights s_k, a usable reward.
  best = state.best_reward
  assert best["score"] == state.best_score == max(
      v["score"] for h in state.history for v in h["variants"] if v["score"] is not None)
  assert 1 <= len(best["modules"]) <= CREDIT.k and len(best["weights"]) == len(best["modules"])
  reward_fn, weights = ev.best_reward_fn(state, FEATURES)
  assert np.all(np.isfinite(np.asarray(reward_fn(STATES, weights).reward)))
  # Selection counts: each round each variant selects min(K, N) modules.
  assert all(st.count >= 0 for st in state.pool.stats.values())


class Crash(BaseException):
  """Simulated pre-emption: not an Exception, so the loop does not record it as a failure."""


def test_resume_matches_uninterrupted_run(tmp_path, sandbox_root, vet_cache):
  proposer = pr.OfflineProposer(pr.OfflineProposerConfig(seed=2))
  cfg = _config(sandbox_root, iterations=2)
  full = ev.evolve(INFO, proposer, toy_train, workdir=str(tmp_path / "a"), config=cfg,
                   vet_cache=vet_cache)

  def crash_in_round_2(cand):
    if cand.iteration == 2 and cand.variant == 1:  # after variant 0 of round 2 trained
      raise Crash()
    return toy_train(cand)

  with pytest.raises(Crash):
    ev.evolve(INFO, proposer, crash_in_round_2, workdir=str(tmp_path / "b"), config=cfg,
              vet_cache=vet_cache)
  assert mp.load_state(tmp_path / "b").iteration == 1
  resumed = ev.evolve(INFO, proposer, toy_train, workdir=str(tmp_path / "b"), config=cfg,
                      vet_cache=vet_cache)
  assert json.dumps(resumed.to_json(), sort_keys=True) == json.dumps(full.to_json(),
                                                                     sort_keys=True)


def test_failures_and_rollback_feed_the_next_reflection(tmp_path, sandbox_root, vet_cache):
  def scripted(cand):
    if cand.iteration == 1 and cand.variant == 1:
      raise RuntimeError("simulator diverged")
    result = toy_train(cand)
    score = 1.0 if cand.iteration == 1 else -1.0  # round 2: both far below S_best = 1
    return result._replace(score=score)

  proposer = pr.OfflineProposer(pr.OfflineProposerConfig(seed=2))
  state = ev.evolve(INFO, proposer, scripted, workdir=str(tmp_path / "wd"),
                    config=_config(sandbox_root, iterations=2), vet_cache=vet_cache)
  h1, h2 = state.history
  assert h1["kind"] == "new_best" and h1["survivors"] == [0]
  assert h2["kind"] == "failed" and h2["rolled_back"] and h2["pool"] == h1["pool"]
  kinds = {(f.iteration, f.kind) for f in state.failures}
  assert {(1, "train_error"), (2, "below_threshold"), (2, "rollback")} <= kinds
  assert state.best_score == 1.0 and state.best_reward["iteration"] == 1
  # What the next (feedback) reflection would see.
  next_reflection = proposer.reflect(INFO, state, iteration=3)
  assert next_reflection.startswith("[failed]") and "rollback" in next_reflection


def test_llm_loop_over_http(tmp_path, sandbox_root, llm_server, vet_cache):
  from jaxrl_post.rewards import llm_client

  client = llm_client.ChatClient(llm_client.ChatConfig(base_url=llm_server.url, model="m",
                                                       max_retries=0, token_budget=100_000))
  state = ev.evolve(INFO, pr.LLMProposer(client), toy_train, workdir=str(tmp_path / "wd"),
                    config=_config(sandbox_root, proposer_workers=2), vet_cache=vet_cache)
  assert state.iteration == 2
  pool = {m.name: m for m in state.pool.modules}
  assert set(pool) == {"speed_bonus", "effort_penalty", "target_speed"}
  assert pool["speed_bonus"].version == 2 and pool["speed_bonus"].lineage == ("speed_bonus@1",)
  rejected = {(r.iteration, r.name): r for r in state.rejected}
  assert rejected[(1, "sneaky")].stage == "validate"
  assert rejected[(1, "log_speed")].stage == "test-run"
  prompts_sent = [r["body"]["messages"][-1]["content"] for r in llm_server.requests]
  feedback = [p for p in prompts_sent if "Feedback on the last round" in p]
  assert len(feedback) == 1 and "sneaky" in feedback[0]
  assert client.tokens_used == 100 * len(llm_server.requests)
