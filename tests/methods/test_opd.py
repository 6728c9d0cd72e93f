"""methods/opd.py: switches, routing errors, routed teacher scores, global weights, refresh in a
real loss, the K inner updates as a PPO phase, headroom recovery."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post import losses
from jaxrl_post.methods import opd
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import score, score_model
from jaxrl_post.training import ppo
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.train_state import create_train_state, make_train_step

VOCAB, K, DOMAINS = 64, 4, ("arith", "countdown", "format")


def _model(seed=0, vocab=VOCAB):
  return CausalLM(get_model_config("tiny", vocab_size=vocab), rngs=nnx.Rngs(seed))


def _rollout(rows=8, prompt_len=5, time=6, seed=0):
  """Left-padded prompts and right-padded completions of random lengths (every row ≥ 1 token)."""
  rng = np.random.default_rng(seed)
  prompt_mask = np.arange(prompt_len)[None] >= rng.integers(0, prompt_len, rows)[:, None]
  completion_mask = np.arange(time)[None] < rng.integers(1, time + 1, rows)[:, None]
  return dict(prompt_tokens=jnp.asarray(rng.integers(1, VOCAB, (rows, prompt_len)), jnp.int32),
              prompt_mask=jnp.asarray(prompt_mask),
              completion_tokens=jnp.asarray(rng.integers(1, VOCAB, (rows, time)), jnp.int32),
              completion_mask=jnp.asarray(completion_mask))


def _score(model, batch, **kw):
  return score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                     batch["completion_tokens"], batch["completion_mask"], **kw)


def _opd_batch(student, teacher, domain_ids, seed=0, weights=None, normalizers=True):
  """A rollout with the student's top-K ids / log-probs, the teacher's on them, and weights."""
  batch = _rollout(rows=len(domain_ids), seed=seed)
  old = _score(student, batch, top_k=K)
  q = _score(teacher, batch, candidate_ids=old.topk_ids).candidate_logp
  if weights is None:
    weights = np.linspace(0.5, 2.0, len(domain_ids))
  batch.update(topk_ids=old.topk_ids, old_topk_logp=jnp.where(
    batch["completion_mask"][..., None], old.topk_logp, 0.0), teacher_topk_logp=q,
               seq_weights=jnp.asarray(weights, jnp.float32),
               domain_ids=jnp.asarray(domain_ids, jnp.int32))
  return ppo.with_normalizers(batch) if normalizers else batch


# ---- methods and routing ----


def test_doctests():
  result = doctest.testmod(opd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted >= 2 and result.failed == 0


def test_methods_are_the_ablation_rows_and_overrides_apply():
  assert opd.resolve_switches("naive") == opd.Switches(False, 0.0, False, 1)
  assert opd.resolve_switches("open_mopd") == opd.Switches(True, 1.0, True, 4)
  # The paper's "naive matched control": naive weights, K = 4; None keeps the method's value.
  control = opd.resolve_switches("naive", inner_updates=4, refresh=None)
  assert control == opd.Switches(False, 0.0, False, 4) == opd.resolve_switches("naive_k4")
  # Its two K = 4 controls differ from Open-MOPD in the refresh only.
  assert opd.resolve_switches("share_gap_k4") == opd.Switches(True, 1.0, False, 4)
  assert opd.resolve_switches("open_mopd")._replace(refresh=False) == opd.resolve_switches(
    "share_gap_k4")
  with pytest.raises(ValueError, match="valid names: gap, naive, naive_k4, open_mopd, "
                                       "share_gap_k4, token_share"):
    opd.resolve_switches("open-mopd")
  with pytest.raises(ValueError, match="inner_updates must be >= 1"):
    opd.resolve_switches("gap", inner_updates=0)


def test_teacher_routing_rejects_unknown_labels_and_domains_without_teacher(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  with pytest.raises(ValueError, match=r"unknown domain label\(s\) 'code'.*known domains: "
                                       r"'arith', 'countdown', 'format'"):
    opd.teacher_routing({"arith": a, "countdown": a, "format": a, "code": b}, DOMAINS)
  with pytest.raises(ValueError, match=r"no teacher checkpoint for domain\(s\) 'format'"):
    opd.teacher_routing({"arith": a, "countdown": b}, DOMAINS)
  with pytest.raises(ValueError, match=r"domain\(s\) 'countdown'"):  # an empty path is no teacher
    opd.teacher_routing({"arith": a, "countdown": "", "format": b}, DOMAINS)
  # One checkpoint routed to two domains is one teacher (loaded and kept once).
  routing = opd.teacher_routing({"format": b, "arith": a, "countdown": a + "/"}, DOMAINS)
  assert routing.paths == (a, b) and routing.teacher_of_domain == (0, 0, 1)
  assert routing.domains_of(0) == ["arith", "countdown"]
  # A path with no checkpoint fails before anything loads or compiles, naming the domains.
  with pytest.raises(FileNotFoundError, match=r"teacher of domain\(s\) 'arith', 'countdown'"):
    opd.find_teacher_checkpoints(routing)
  # Unknown domain ids are rejected before any teacher runs.
  with pytest.raises(ValueError, match=r"unknown domain id\(s\) 3"):
    opd.score_routed(None, [None], (0, 0, 0), _rollout(rows=2), [0, 3],
                     jnp.zeros((2, 6, K), jnp.int32), rows_per_call=2)


def test_load_teachers_restores_params_and_rejects_another_architecture(tmp_path):
  optimizer = optax.adamw(1e-3)
  teacher = create_train_state(_model(seed=3), optimizer, jax.random.key(0))
  saver = Checkpointer(tmp_path / "teacher" / "checkpoints")
  saver.save(7, teacher)
  saver.close()
  other = create_train_state(_model(vocab=VOCAB + 8), optimizer, jax.random.key(0))
  saver = Checkpointer(tmp_path / "other")
  saver.save(1, other)
  saver.close()

  student = create_train_state(_model(seed=0), optimizer, jax.random.key(0))
  routing = opd.teacher_routing({d: str(tmp_path / "teacher") for d in DOMAINS}, DOMAINS)
  starts = opd.find_teacher_checkpoints(routing)
  assert [(s.kind, s.step) for s in starts] == [("init_from_checkpoint", 7)]
  (params,) = opd.load_teachers(starts, student)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(teacher.params)):
    np.testing.assert_array_equal(got, want)
  bad = opd.find_teacher_checkpoints(opd.teacher_routing(
    {d: str(tmp_path / "other") for d in DOMAINS}, DOMAINS))
  with pytest.raises(ValueError, match="teacher .*other"):
    opd.load_teachers(bad, student)


# ---- routed teacher scoring ----


def test_routed_scores_equal_each_domain_scored_alone_with_one_compile():
  teachers = [_model(seed=s) for s in (1, 2, 3)]
  graphdef = nnx.split(teachers[0])[0]
  params = [nnx.state(t) for t in teachers]
  calls = []

  @jax.jit
  def score_fn(p, prompt_tokens, prompt_mask, completion_tokens, completion_mask, cand):
    calls.append(prompt_tokens.shape)  # runs at trace time only
    return score(graphdef, p, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                 candidate_ids=cand).candidate_logp

  domain_ids = np.array([0, 2, 1, 0, 0, 2, 1, 0])  # 4 / 2 / 2 rows: unequal domain sizes
  batch = _rollout(rows=8)
  ids = _score(teachers[0], batch, top_k=K).topk_ids
  # Teacher 2 is routed to domains 1 and 2; teacher 0 to domain 0; the middle one is unused.
  routed = opd.score_routed(score_fn, params, (0, 2, 2), batch, domain_ids, ids, rows_per_call=3)
  assert len(calls) == 1  # three teachers' calls (domain 0 in two chunks), one compilation
  for d, t in enumerate((0, 2, 2)):
    rows = np.flatnonzero(domain_ids == d)
    alone = _score(teachers[t], {k: v[rows] for k, v in batch.items()},
                   candidate_ids=ids[rows]).candidate_logp
    np.testing.assert_allclose(routed[rows], alone, rtol=1e-5, atol=1e-5)
  # Padding positions are 0, as in `score`.
  assert float(jnp.abs(jnp.where(batch["completion_mask"][..., None], 0.0, routed)).max()) == 0


# ---- domain weights from global statistics ----


def test_domain_weights_use_global_stats_across_any_split():
  rng = np.random.default_rng(0)
  rows, time = 16, 7
  mask = (np.arange(time)[None] < rng.integers(1, time + 1, rows)[:, None]).astype(np.float32)
  domain_ids = np.repeat([0, 1, 2, 0], 4)
  mask[domain_ids == 2, 2:] = 0  # the short-answer domain: a small token share
  rewards = rng.normal(0, 1, (rows, time, K)).astype(np.float32) * mask[..., None]
  kw = dict(alpha=1.0, balance_shares=True, target_shares=[1 / 3] * 3)  # "gap"
  full, table = losses.rollout_domain_weights(mask, domain_ids, rewards, **kw)
  chunked, _ = losses.rollout_domain_weights(mask, domain_ids, rewards, num_chunks=4, **kw)
  np.testing.assert_allclose(chunked, full, rtol=1e-6)
  # Token-weighted mean 1, and the short domain is up-weighted (M1).
  lengths = mask.sum(1)
  np.testing.assert_allclose(np.sum(full * lengths) / lengths.sum(), 1.0, rtol=1e-5)
  assert table.share_weight[2] > 1 > table.share_weight[0]
  # The mini-batches of the inner updates carry the full-batch weights of their rows, which
  # differ from weights computed inside one mini-batch (so the split does matter).
  batch = {"completion_mask": mask, "seq_weights": np.asarray(full), "row": np.arange(rows)}
  for part in ppo.ppo_mini_batches(batch, 4, np.random.default_rng(1)):
    np.testing.assert_array_equal(part["seq_weights"], np.asarray(full)[part["row"]])
  local, _ = losses.rollout_domain_weights(mask[:4], domain_ids[:4], rewards[:4], **kw)
  assert not np.allclose(local, np.asarray(full)[:4])
  # Naive M-OPD: uniform weights.
  naive, _ = losses.rollout_domain_weights(mask, domain_ids, rewards, alpha=0.0,
                                           balance_shares=False, target_shares=[1 / 3] * 3)
  np.testing.assert_allclose(naive, np.ones(rows), rtol=1e-6)


# ---- the loss wired to a real model ----


def _perturbed(params, scale=0.05, seed=0):
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                   for x, k in zip(leaves, keys)])


def test_refresh_recomputes_only_the_student_part_inside_the_real_loss():
  student, teacher = _model(seed=0), _model(seed=1)
  graphdef, old_params = nnx.split(student)
  batch = _opd_batch(student, teacher, [0, 1, 2, 0, 1, 2])
  mask = batch["completion_mask"]
  losses_of = {}
  for refresh in (True, False):
    loss = opd.make_opd_loss(num_domains=3, refresh=refresh)
    losses_of[refresh] = jax.jit(jax.value_and_grad(
      lambda p, fn=loss: fn(nnx.merge(graphdef, p), batch), has_aux=True))

  # On-policy (θ = θ_old) the refreshed reward is the rollout-time one: same loss, same grads.
  (v_on, _), g_on = losses_of[True](old_params)
  (v_off, _), g_off = losses_of[False](old_params)
  np.testing.assert_allclose(v_on, v_off, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_on), jax.tree.leaves(g_off)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)

  # After the student moved: the refreshed advantage is (q − s_cur)·softmax(s_cur)·m·w with the
  # *cached* teacher q and the current student's sg(s_cur); the ratio is still against s_old.
  new_params = _perturbed(old_params)
  s_cur = _score(nnx.merge(graphdef, new_params), batch,
                 candidate_ids=batch["topk_ids"]).candidate_logp
  s_old, q, w = batch["old_topk_logp"], batch["teacher_topk_logp"], batch["seq_weights"]

  def reference(params, student_part):
    adv = losses.topk_opd_reward(student_part, q, mask) * mask[..., None] * w[:, None, None]
    cur = _score(nnx.merge(graphdef, params), batch,
                 candidate_ids=batch["topk_ids"]).candidate_logp
    rho = jnp.exp(jnp.clip(jnp.where(mask[..., None], cur - s_old, 0.0), -20, 20))
    per = jnp.maximum(-adv * rho, -adv * jnp.clip(rho, 0.8, 1.28))
    per = jnp.where(adv < 0, jnp.minimum(per, -3.0 * adv), per)
    return jnp.sum(jnp.where(mask, per.sum(-1), 0.0)) / batch["num_tokens"]

  (v_ref, aux), g_ref = losses_of[True](new_params)
  want, g_want = jax.value_and_grad(reference)(new_params, s_cur)
  np.testing.assert_allclose(v_ref, want, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The stale variant keeps the rollout-time student part and differs.
  (v_stale, _), _ = losses_of[False](new_params)
  np.testing.assert_allclose(v_stale, reference(new_params, s_old), rtol=1e-5)
  assert abs(float(v_stale) - float(v_ref)) > 1e-4
  # The refreshed reward used is reported per domain: Σ over domains = Σ over all tokens.
  used = losses.topk_opd_reward(s_cur, q, mask)
  np.testing.assert_allclose(aux["domain_abs_reward"].sum(), jnp.abs(used.sum(-1)).sum(),
                             rtol=1e-5)
  assert float(aux["staleness_kl"]) > 0


def test_inner_updates_refresh_each_update_and_micro_batches_match():
  student, teacher = _model(seed=0), _model(seed=1)
  graphdef = nnx.split(student)[0]
  batch = _opd_batch(student, teacher, [0, 1, 2, 0, 1, 2, 0, 1], weights=np.ones(8),
                     normalizers=False)  # each mini-batch gets its own
  results = {}
  for micro in (1, 2):
    optimizer = optax.sgd(0.5)
    state = create_train_state(student, optimizer, jax.random.key(0))
    step_fn = make_train_step(graphdef, opd.make_opd_loss(num_domains=3, refresh=True),
                              optimizer, num_micro_batches=micro,
                              shared=("num_tokens", "num_sequences"))
    results[micro] = ppo.ppo_phase(step_fn, state, batch, epochs=1, mini_batches=2,
                                   rng=np.random.default_rng(0))[1]
  updates = results[1]
  assert len(updates) == 2
  # Update 0 runs at θ_old (nothing stale); update 1 at θ_1, so its reward was refreshed.
  assert float(updates[0]["staleness_kl"]) < 1e-6 < float(updates[1]["staleness_kl"])
  for a, b in zip(results[1], results[2]):  # micro-batches add up to the mini-batch
    for key in ("loss", "staleness_kl", "clip_frac", "domain_tokens", "domain_staleness"):
      np.testing.assert_allclose(a[key], b[key], rtol=2e-4, atol=1e-7)
  merged = opd.update_metrics(updates, DOMAINS)
  assert merged["num_updates"] == 2 and merged["staleness_kl_last"] > 0
  for d in DOMAINS:
    assert {f"{d}/staleness_kl", f"{d}/clip_frac", f"{d}/update_mean_abs_reward"} <= set(merged)


@pytest.mark.parametrize("method", ["naive_k4", "share_gap_k4", "open_mopd"])
def test_k4_controls_reuse_rollout_rewards_open_mopd_refreshes_them(method):
  """The matched controls take K = 4 updates on one rollout batch with the reward computed once.

  As `OpenMOPD.start/step` wire it (loss `refresh=switches.refresh`, `ppo_phase` with
  `mini_batches=switches.inner_updates`, one epoch): each row is in exactly one mini-batch, so
  the rewards the K updates used, Σ_updates Σ m·|Σ_k r_used|, equal the rollout-time
  Σ m·|Σ_k (q − s_old)·softmax_K(s_old)| iff nothing was refreshed, although the student moved
  (staleness > 0 in updates 2..K). With refresh (Open-MOPD) updates 2..K use the current
  student's part and the sum differs.
  """
  switches = opd.resolve_switches(method)
  assert switches.inner_updates == 4
  student, teacher = _model(seed=0), _model(seed=1)
  graphdef = nnx.split(student)[0]
  domain_ids = [0, 1, 2, 0, 1, 2, 0, 1]
  batch = _opd_batch(student, teacher, domain_ids, weights=np.ones(8), normalizers=False)
  mask = batch["completion_mask"]
  rollout_reward = losses.topk_opd_reward(batch["old_topk_logp"], batch["teacher_topk_logp"],
                                          mask)
  per_row = np.asarray(jnp.sum(jnp.where(mask, jnp.abs(rollout_reward.sum(-1)), 0.0), -1))

  optimizer = optax.sgd(0.5)
  state = create_train_state(student, optimizer, jax.random.key(0))
  step_fn = make_train_step(graphdef, opd.make_opd_loss(num_domains=3, refresh=switches.refresh),
                            optimizer, shared=("num_tokens", "num_sequences"))
  _, updates = ppo.ppo_phase(step_fn, state, batch, epochs=1,
                             mini_batches=switches.inner_updates, rng=np.random.default_rng(0))
  assert len(updates) == 4
  # Update 1 runs at θ_old; the student moves, so updates 2..4 are off-policy either way.
  assert float(updates[0]["staleness_kl"]) < 1e-6
  assert all(float(u["staleness_kl"]) > 1e-6 for u in updates[1:])
  used = np.sum([u["domain_abs_reward"] for u in updates], axis=0)  # [D]
  want = np.bincount(domain_ids, weights=per_row, minlength=3)
  if switches.refresh:
    assert np.abs(used - want).max() > 1e-4 * want.max()
  else:
    np.testing.assert_allclose(used, want, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# The paper's evaluation arithmetic (arXiv 2608.19098, Table 1).
# ---------------------------------------------------------------------------------------------

# Domain scores (math, code, IF) from the results table; Total = mean of the three.
TABLE = {
  "MixSFT e4": (17.95, 17.60, 41.46),
  "RouteRL": (24.24, 21.73, 51.08),
  "RouteOPD": (23.15, 21.71, 49.80),
  "RFT": (23.44, 19.21, 36.87),
  "MixRL": (21.64, 18.78, 46.45),
  "ParamMerge-Avg": (19.95, 19.79, 43.86),
  "ParamMerge-TA": (22.34, 22.44, 46.60),
  "Naive M-OPD": (21.26, 19.26, 43.64),
  "Open-MOPD": (22.42, 21.73, 49.58),
}
RECOVERY = {
  "RouteOPD": 88.0,
  "RFT": 12.6,
  "MixRL": 49.3,
  "ParamMerge-Avg": 32.9,
  "ParamMerge-TA": 71.7,
  "Naive M-OPD": 35.6,
  "Open-MOPD": 83.4,
}


def test_headroom_recovery_from_the_table():
  # Totals as printed: 25.67 / 32.35 / 28.05 / 31.24 (e.g. (22.42 + 21.73 + 49.58)/3 = 31.243).
  totals = {name: round(sum(s) / 3, 2) for name, s in TABLE.items()}
  assert totals["MixSFT e4"] == 25.67 and totals["RouteRL"] == 32.35
  assert totals["Naive M-OPD"] == 28.05 and totals["Open-MOPD"] == 31.24
  # Naive: (28.05 − 25.67)/(32.35 − 25.67) = 2.38/6.68 = 35.6 %; Open-MOPD: 5.57/6.68 = 83.4 %.
  assert round(100 * opd.headroom_recovery(28.05, 25.67, 32.35), 1) == 35.6
  assert round(100 * opd.headroom_recovery(31.24, 25.67, 32.35), 1) == 83.4
  for name, expected in RECOVERY.items():
    got = opd.headroom_recovery(totals[name], totals["MixSFT e4"], totals["RouteRL"])
    assert round(100 * got, 1) == expected, name
  assert opd.headroom_recovery(32.35, 25.67, 32.35) == 1.0
  # Integration gap = Total(RouteOPD) − Total(method): 3.50 (naive) → 0.31 (Open-MOPD).
  assert round(totals["RouteOPD"] - totals["Naive M-OPD"], 2) == 3.50
  assert round(totals["RouteOPD"] - totals["Open-MOPD"], 2) == 0.31
  np.testing.assert_allclose(
    opd.headroom_recovery(np.array([28.05, 31.24]), 25.67, 32.35), [0.3563, 0.8338], atol=1e-4
  )
  with pytest.raises(ValueError, match="no headroom"):
    opd.headroom_recovery(1.0, 2.0, 2.0)
