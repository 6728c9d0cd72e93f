"""MLREF baselines with memory: monolithic / no_pool edit the best reward so far (R*).

The proposals must be edits of R* by the offline proposer's own operators (deterministic per
seed, iteration and variant), not fresh random rewards.
"""

import numpy as np

from jaxrl_post.rewards import module_code
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.proposers import OfflineProposer, OfflineProposerConfig
from jaxrl_post.rl_control import adapter, envs

TASK = envs.make_task("CartPole-v1")
INFO = TASK.task_info()
BASE_CFG = OfflineProposerConfig(seed=3, max_ops=2)


def _state(modules, weights, score=100.0):
  return mp.PoolState(iteration=1, best_score=score, best_reward={
      "iteration": 1, "variant": 0, "score": score,
      "modules": [m.to_json() for m in modules], "weights": list(weights)})


def _best_monolithic():
  mono = adapter.MonolithicProposer(OfflineProposer(BASE_CFG))
  op = mono.init_pool(INFO, "", iteration=1, variant=0, num_variants=2).ops[0]
  return mp.ModuleSpec(name="reward", description=op.description, code=op.code)


def test_split_monolithic_inverts_combine_modules():
  codes = ['def a(f):\n  return f["x"]\n',
           'def b(g):\n  t = jnp.square(g["theta"])\n  return -t / 0.5\n']
  desc = adapter.monolithic_description(["a", "b"], [0.25, 2.0])
  assert desc == "0.25*a + 2*b"
  code = adapter.combine_modules(codes, [0.25, 2.0], doc=desc)
  terms = adapter.split_monolithic(code, desc)
  assert [(n, c) for n, c, _ in terms] == [("a", 0.25), ("b", 2.0)]
  # The local `t` goes back to term b without the m1_ prefix; re-fusing gives the same code.
  assert "m1_" not in terms[1][2] and "t = jnp.square" in terms[1][2]
  assert adapter.combine_modules([c for *_, c in terms], [0.25, 2.0], doc=desc) == code
  for _, _, c in terms:
    module_code.validate_module_code(c, TASK.feature_spec.keys())
  # Without a matching description the terms get positional names.
  assert [n for n, *_ in adapter.split_monolithic(code, "")] == ["term0", "term1"]


def test_monolithic_edits_the_best_reward():
  best = _best_monolithic()
  before = adapter.split_monolithic(best.code, best.description)
  state = _state([best], [1.0])
  pool = mp.Pool((best,))
  mono = adapter.MonolithicProposer(OfflineProposer(BASE_CFG))
  plans = [mono.improve_pool(INFO, pool, "", state, iteration=2, variant=v, num_variants=2)
           for v in range(2)]
  for plan in plans:
    assert [o.op for o in plan.ops] == ["REWRITE"] and plan.ops[0].name == "reward"
    assert plan.rationale == "edit the best reward so far"
    module_code.validate_module_code(plan.ops[0].code, TASK.feature_spec.keys())
    after = adapter.split_monolithic(plan.ops[0].code, plan.ops[0].description)
    old = {n: (c, code) for n, c, code in before}
    new = {n: (c, code) for n, c, code in after}
    # An edit: at most max_ops terms differ; every other term (name, coefficient, code) stays.
    changed = {n for n in old.keys() | new.keys() if old.get(n) != new.get(n)}
    assert 1 <= len(changed) <= BASE_CFG.max_ops
    assert len(set(old) & set(new)) >= len(old) - BASE_CFG.max_ops
    for n in set(old) & set(new):
      assert new[n][0] == old[n][0]  # Kept and edited terms keep their coefficient.
  assert plans[0].ops[0].code != plans[1].ops[0].code  # Variants draw their own edits.
  # Deterministic: a new proposer with the same seed proposes the same edit.
  again = adapter.MonolithicProposer(OfflineProposer(BASE_CFG)).improve_pool(
      INFO, pool, "", state, iteration=2, variant=0, num_variants=2)
  assert again == plans[0]


def test_monolithic_edit_matches_the_offline_proposers_plan_on_the_terms():
  # The same operators: the edit is exactly what OfflineProposer.improve_pool does to a pool
  # holding R*'s terms, with the coefficients as the credit its DELETE reads.
  best = _best_monolithic()
  terms = adapter.split_monolithic(best.code, best.description)
  term_pool = mp.Pool(tuple(mp.ModuleSpec(name=n, description=n, code=c) for n, _, c in terms),
                      {n: mp.ModuleStats(ema_llm=w) for n, w, _ in terms})
  plan = OfflineProposer(BASE_CFG).improve_pool(INFO, term_pool, "", mp.PoolState(),
                                                iteration=3, variant=1, num_variants=2)
  edited, _, _ = mp.apply_plan(term_pool, plan, accept=lambda c: (True, "", ""), iteration=3,
                               variant=1)
  mono = adapter.MonolithicProposer(OfflineProposer(BASE_CFG))
  out = mono.improve_pool(INFO, mp.Pool((best,)), "", _state([best], [1.0]), iteration=3,
                          variant=1, num_variants=2).ops[0]
  assert [n for n, *_ in adapter.split_monolithic(out.code, out.description)] == \
      list(edited.names)
  for op in plan.ops:
    if op.op == "DELETE":  # The smallest coefficient goes first.
      assert op.name == min(terms, key=lambda t: (t[1], t[0]))[0]


def test_monolithic_without_memory_or_best_draws_fresh():
  best = _best_monolithic()
  pool = mp.Pool((best,))
  fresh = adapter.MonolithicProposer(OfflineProposer(BASE_CFG), memory=False).improve_pool(
      INFO, pool, "", _state([best], [1.0]), iteration=2, variant=0, num_variants=2)
  no_best = adapter.MonolithicProposer(OfflineProposer(BASE_CFG)).improve_pool(
      INFO, pool, "", mp.PoolState(), iteration=2, variant=0, num_variants=2)
  assert fresh.rationale == no_best.rationale == "rewrite the whole reward"
  assert fresh.ops[0].code == no_best.ops[0].code != best.code


def test_no_pool_edits_the_best_reward_modules():
  base = OfflineProposer(BASE_CFG)
  init = base.init_pool(INFO, "", iteration=1, variant=0, num_variants=2)
  mods = [mp.ModuleSpec(name=o.name, description=o.description, code=o.code) for o in init.ops]
  selected, weights = mods[:3], [0.5, 0.3, 0.2]
  # The global pool has R*'s modules and more (unselected ones, carried credit).
  pool = mp.Pool(tuple(mods), {m.name: mp.ModuleStats(ema_corr=0.9, count=3) for m in mods})
  nopool = adapter.NoPoolProposer(OfflineProposer(BASE_CFG))
  plan = nopool.improve_pool(INFO, pool, "", _state(selected, weights), iteration=2, variant=1,
                             num_variants=2)
  new, _, rejected = mp.apply_plan(pool, plan, accept=lambda c: (True, "", ""), iteration=2,
                                   variant=1)
  assert not rejected
  # Exactly the offline proposer's edit of R*'s modules (fresh credit; R* weights as credit).
  start = mp.Pool(tuple(selected), {m.name: mp.ModuleStats(ema_llm=w)
                                    for m, w in zip(selected, weights)})
  edit = OfflineProposer(BASE_CFG).improve_pool(INFO, start, "", mp.PoolState(), iteration=2,
                                                variant=1, num_variants=2)
  expected, _, _ = mp.apply_plan(start, edit, accept=lambda c: (True, "", ""), iteration=2,
                                 variant=1)
  assert new.names == expected.names
  assert [m.code for m in new.modules] == [m.code for m in expected.modules]
  assert all(s == mp.ModuleStats() for s in new.stats.values())  # No credit carried over.
  assert not set(new.names) & ({m.name for m in mods} - {m.name for m in selected}
                               - set(expected.names))
  # Without memory: delete everything, fresh draw.
  plan = adapter.NoPoolProposer(OfflineProposer(BASE_CFG), memory=False).improve_pool(
      INFO, pool, "", _state(selected, weights), iteration=2, variant=1, num_variants=2)
  assert plan.rationale == "no pool: start over"
  assert np.sum([o.op == "DELETE" for o in plan.ops]) == len(pool)


class _ScriptedClient:
  """A chat client that answers every request with one fenced code block and records prompts."""

  def __init__(self, code: str):
    self.code, self.prompts = code, []

  def chat(self, messages, temperature=None):
    del temperature
    self.prompts.append(messages[-1]["content"])
    return type("Reply", (), {"text": f"Here it is:\n```python\n{self.code}```\n"})()


def test_monolithic_llm_edits_a_free_form_best_reward_with_modify_code():
  """An R* an LLM wrote freely (not `combine_modules`' form) cannot be split into terms: the
  LLM proposer then gets the whole function in a MODIFY prompt and its reply REWRITEs it."""
  from jaxrl_post.rewards.proposers import LLMProposer

  free = 'def reward(f):\n  if_upright = 1.0 - jnp.abs(f["theta"])\n  return if_upright * 2.0\n'
  edited = 'def reward(f):\n  return 1.0 - jnp.abs(f["theta"]) - 0.1 * jnp.abs(f["x"])\n'
  best = mp.ModuleSpec(name="reward", description="upright bonus", code=free)
  client = _ScriptedClient(edited)
  mono = adapter.MonolithicProposer(LLMProposer(client))
  plan = mono.improve_pool(INFO, mp.Pool((best,)), "keep it upright", _state([best], [1.0]),
                           iteration=2, variant=0, num_variants=1)
  assert [(o.op, o.name) for o in plan.ops] == [("REWRITE", "reward")]
  assert plan.rationale == "edit the best reward so far"
  assert plan.ops[0].code.strip() == edited.strip()
  assert plan.ops[0].description == "upright bonus"
  # One MODIFY prompt that shows R*'s current code and the reflection.
  assert len(client.prompts) == 1
  assert 'if_upright = 1.0 - jnp.abs(f["theta"])' in client.prompts[0]
  assert "keep it upright" in client.prompts[0]
