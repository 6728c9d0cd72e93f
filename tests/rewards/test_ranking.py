"""PCQA-R1 ranking rewards and quality metrics: golden values, invariances, parsing, scipy."""

import doctest
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import quality_metrics, ranking
from jaxrl_post.rewards.quality_metrics import (
  average_ranks,
  krcc,
  logistic4,
  logistic_fit,
  pearson,
  srcc,
)
from jaxrl_post.rewards.ranking import (
  RANKING_REWARDS,
  format_reward,
  format_weight,
  gaussian_proximity,
  parse_completions,
  parse_score,
  prompt_statistics,
  thurstone_fidelity_reward,
  thurstone_probability,
  total_reward,
)

# Three prompts, K = 2, every prompt's rollouts μ ± 0.5 (population σ² = 0.25), and γ = 0.5, so
# every Thurstone denominator is √(0.25 + 0.25 + 0.5) = 1 and z = ŷ_ik − μ_j.
#   P0: ŷ = [2.5, 3.5], μ = 3, MOS 0.8   (above both others: g = 1, term √Φ(z))
#   P1: ŷ = [1.5, 2.5], μ = 2, MOS 0.2   (below P0: g = 0, term √Φ(−z); tie with P2)
#   P2: ŷ = [3.5, 4.5], μ = 4, MOS 0.2   (below P0; tie with P1)
# A tie (g = 0.5) gives t(z) = √(Φ(z)/2) + √(Φ(−z)/2), symmetric in z.
# Φ(0.5) = 0.691462, Φ(1.5) = 0.933193, Φ(2.5) = 0.993790.
#   √Φ(0.5) = 0.831542, √Φ(−0.5) = 0.555462, √Φ(1.5) = 0.966019, √Φ(−1.5) = 0.258471,
#   t(1.5) = 0.865845, t(2.5) = 0.760629.
# Row 0: k0: z = 0.5 vs P1, −1.5 vs P2 → (0.831542 + 0.258471)/2 = 0.545007
#        k1: z = 1.5, −0.5           → (0.966019 + 0.555462)/2 = 0.760740
# Row 1: k0: z = −1.5 vs P0, −2.5 vs P2 → (√Φ(1.5) + t(2.5))/2 = (0.966019 + 0.760629)/2 = 0.863324
#        k1: z = −0.5, −1.5            → (0.831542 + 0.865845)/2 = 0.848694
# Row 2: k0: z = 0.5 vs P0, 1.5 vs P1   → (√Φ(−0.5) + t(1.5))/2 = (0.555462 + 0.865845)/2 = 0.710653
#        k1: z = 1.5, 2.5               → (0.258471 + 0.760629)/2 = 0.509550
# (A Bessel σ² = 0.5 would make the denominators √1.5 and change every value.)
SCORES = np.array([[2.5, 3.5], [1.5, 2.5], [3.5, 4.5]], np.float32)
MOS = np.array([0.8, 0.2, 0.2], np.float32)
GOLDEN = np.array([[0.545007, 0.760740], [0.863324, 0.848694], [0.710653, 0.509550]])
GAMMA = 0.5


def _random_batch(seed, num_prompts=6, k=4, nan_frac=0.15):
  rng = np.random.default_rng(seed)
  scores = rng.uniform(1.0, 5.0, (num_prompts, k)).astype(np.float32)
  scores[rng.uniform(size=scores.shape) < nan_frac] = np.nan
  return scores


def _phi(z):
  return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _reference_reward(scores, mos, gamma, prompt_ids):
  """Loops over the formula in float64: average over unique other prompts, copies averaged."""
  scores = np.asarray(scores, np.float64)
  num_prompts, k = scores.shape
  valid = np.isfinite(scores)
  has = valid.any(axis=1)
  mu = [scores[j][valid[j]].mean() if has[j] else None for j in range(num_prompts)]
  var = [scores[j][valid[j]].var() if has[j] else None for j in range(num_prompts)]
  out = np.zeros((num_prompts, k))
  for i in range(num_prompts):
    others = {prompt_ids[j] for j in range(num_prompts) if has[j]} - {prompt_ids[i]}
    for kk in range(k):
      if not valid[i, kk] or not others:
        continue
      per_prompt = []
      for u in others:
        terms = []
        for j in (j for j in range(num_prompts) if prompt_ids[j] == u and has[j]):
          p = _phi((scores[i, kk] - mu[j]) / np.sqrt(var[i] + var[j] + gamma))
          g = 1.0 if mos[i] > mos[j] else (0.0 if mos[i] < mos[j] else 0.5)
          terms.append(np.sqrt(p * g) + np.sqrt((1 - p) * (1 - g)))
        per_prompt.append(np.mean(terms))
      out[i, kk] = np.mean(per_prompt)
  return out


def test_doctests():
  assert doctest.testmod(ranking).failed == 0
  assert doctest.testmod(quality_metrics).failed == 0


def test_registry():
  assert {'thurstone_fidelity'} <= set(RANKING_REWARDS.names())
  assert RANKING_REWARDS.get("thurstone_fidelity") is thurstone_fidelity_reward
  with pytest.raises(KeyError, match="unknown ranking reward 'listnet'; valid names: .*thurstone"):
    RANKING_REWARDS.get("listnet")


def test_prompt_statistics_population_std_over_valid_rollouts():
  # [1, 2, NaN, 3]: μ = 2, σ² = (1 + 0 + 1)/3 (population); all-NaN row: μ = σ² = n = 0.
  stats = prompt_statistics(np.array([[1.0, 2.0, np.nan, 3.0], [np.nan] * 4], np.float32))
  np.testing.assert_allclose(stats.mean, [2.0, 0.0])
  np.testing.assert_allclose(stats.var, [2.0 / 3.0, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(stats.count, [3.0, 0.0])


def test_thurstone_probability_golden():
  # z = ŷ − μ_j with unit denominators (see the comment at the top).
  p = thurstone_probability(SCORES, gamma=GAMMA)
  assert p.shape == (3, 2, 3)
  np.testing.assert_allclose(p[0, :, 1], [0.691462, 0.933193], atol=1e-6)  # Φ(0.5), Φ(1.5)
  np.testing.assert_allclose(p[1, :, 2], [0.006210, 0.066807], atol=1e-6)  # Φ(−2.5), Φ(−1.5)


def test_fidelity_reward_golden():
  out = thurstone_fidelity_reward(SCORES, MOS, gamma=GAMMA)
  np.testing.assert_allclose(out, GOLDEN, atol=2e-6)
  np.testing.assert_allclose(out, _reference_reward(SCORES, MOS, GAMMA, [0, 1, 2]), atol=2e-6)


def test_ties_count_half():
  # Equal MOS: g = 0.5, so a rollout exactly at the other prompt's mean (p = 0.5) gets the full
  # fidelity √0.25 + √0.25 = 1, and z = ±1 gets t(1) = √(Φ(1)/2) + √(Φ(−1)/2) = 0.930244.
  # With γ = 0.5 and σ² = 0.25 for both prompts the denominator is 1.
  scores = np.array([[2.5, 3.5], [1.5, 2.5]], np.float32)  # μ = 3 and 2
  out = thurstone_fidelity_reward(scores, np.array([0.4, 0.4]), gamma=GAMMA)
  # Row 0 vs μ1 = 2: z = 0.5, 1.5 → t(0.5) = 0.980760, t(1.5) = 0.865845.
  # Row 1 vs μ0 = 3: z = −1.5, −0.5 → t(1.5), t(0.5).
  np.testing.assert_allclose(out, [[0.980760, 0.865845], [0.865845, 0.980760]], atol=2e-6)
  scores = np.array([[2.0, 4.0], [3.0, 3.0]], np.float32)  # σ² = 1 and 0, γ = 0: denominator 1
  out = thurstone_fidelity_reward(scores, np.array([1, 1]), gamma=0.0)
  np.testing.assert_allclose(out, [[0.930244, 0.930244], [1.0, 1.0]], atol=2e-6)


_TRANSFORMS = {
  "affine": lambda y: 10.0 * y + 3.0,
  "exp": lambda y: np.exp(4.0 * y),
  "cube": lambda y: (y - 0.5) ** 3,
  "log": np.log,
  "reciprocal": lambda y: -1.0 / y,
  "arctan": lambda y: np.arctan(20.0 * (y - 0.5)),
  "average_ranks": average_ranks,
  "int_ranks": lambda y: np.unique(y, return_inverse=True)[1].astype(np.int32),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_invariant_to_strictly_increasing_mos_transforms(name):
  # MOS with ties (0.3 three times, 0.7 twice) and NaN scores; any strictly increasing map keeps
  # every comparison y_i > y_j, y_i = y_j, so the rewards must be bit-identical.
  mos = np.array([0.3, 0.7, 0.3, 0.9, 0.1, 0.7, 0.3, 0.5])
  scores = _random_batch(1, num_prompts=8)
  ids = np.array([0, 1, 2, 3, 4, 5, 2, 6])  # with a repeated prompt as well
  base = thurstone_fidelity_reward(scores, mos.astype(np.float32), prompt_ids=ids)
  moved = thurstone_fidelity_reward(scores, _TRANSFORMS[name](mos), prompt_ids=ids)
  np.testing.assert_array_equal(base, moved)


def test_not_invariant_to_order_changes():
  mos = np.array([0.3, 0.7, 0.3, 0.9, 0.1, 0.7], np.float32)
  scores = _random_batch(1)
  base = thurstone_fidelity_reward(scores, mos)
  assert not np.allclose(base, thurstone_fidelity_reward(scores, (mos - 0.5) ** 2))


def test_repeated_prompts_are_excluded_and_weigh_once():
  p0_copy = np.array([[2.0, 3.0]], np.float32)  # same prompt as row 0, other rollouts
  scores = np.concatenate([SCORES, p0_copy])
  mos = np.append(MOS, MOS[0])
  ids = np.array([0, 1, 2, 0])
  out = np.asarray(thurstone_fidelity_reward(scores, mos, gamma=GAMMA, prompt_ids=ids))
  np.testing.assert_allclose(out, _reference_reward(scores, mos, GAMMA, ids), atol=2e-6)

  # Pairwise terms from two-prompt batches: f(i vs j) is row 0's reward in the batch [i, j]
  # (a row's μ, σ depend on its own rollouts only).
  def pair(i, j):
    return np.asarray(thurstone_fidelity_reward(scores[[i, j]], mos[[i, j]], gamma=GAMMA))[0]

  # Row 0 never meets its copy (row 3): it sees P1 and P2 only, as in the batch without the copy.
  np.testing.assert_allclose(out[0], GOLDEN[0], atol=2e-6)
  np.testing.assert_allclose(out[3], (pair(3, 1) + pair(3, 2)) / 2, atol=2e-6)
  # Row 1 sees 2 unique prompts: the copies of P0 share one unit of weight.
  np.testing.assert_allclose(out[1], ((pair(1, 0) + pair(1, 3)) / 2 + pair(1, 2)) / 2, atol=2e-6)
  # Identical copies leave every other row unchanged.
  same = thurstone_fidelity_reward(
    np.concatenate([SCORES, SCORES[:1]]), np.append(MOS, MOS[0]), gamma=GAMMA, prompt_ids=ids
  )
  np.testing.assert_allclose(same[:3], GOLDEN, atol=2e-6)
  np.testing.assert_allclose(same[3], same[0], atol=1e-7)
  # Without prompt_ids the copy counts as a different prompt (tie in MOS), which changes row 0.
  assert not np.allclose(thurstone_fidelity_reward(scores, mos, gamma=GAMMA)[0], out[0])


def test_unparseable_rollouts_and_lonely_prompts_get_zero():
  scores = np.array([[3.0, np.nan], [np.nan, np.nan], [2.0, 4.0]], np.float32)
  out = np.asarray(thurstone_fidelity_reward(scores, np.array([0.5, 0.9, 0.1])))
  assert out[0, 1] == 0.0 and np.all(out[1] == 0.0)
  # Row 0 compares with row 2 only (row 1 has no valid rollout): z = (3 − 3)/√(0 + 1 + 1e-6),
  # g = 1 → √0.5; row 2 vs row 0 (μ = 3, σ² = 0): g = 0 → √Φ(∓1) = √Φ(−(ŷ − 3)).
  np.testing.assert_allclose(out[0, 0], np.sqrt(0.5), atol=1e-6)
  np.testing.assert_allclose(out[2], [0.917248, 0.398316], atol=2e-6)
  # One prompt (or copies of one prompt) alone: no comparison, reward 0.
  assert np.all(np.asarray(thurstone_fidelity_reward(SCORES[:1], MOS[:1])) == 0.0)
  lonely = thurstone_fidelity_reward(SCORES[:2], MOS[:2], prompt_ids=np.array([4, 4]))
  assert np.all(np.asarray(lonely) == 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference(seed):
  scores = _random_batch(seed, num_prompts=7, k=4)
  rng = np.random.default_rng(seed + 10)
  mos = rng.choice([0.1, 0.4, 0.4, 0.6, 0.9], size=7).astype(np.float32)
  ids = rng.integers(0, 5, size=7)
  out = thurstone_fidelity_reward(scores, mos, gamma=1e-2, prompt_ids=ids)
  np.testing.assert_allclose(out, _reference_reward(scores, mos, 1e-2, ids), atol=2e-6)


def test_gaussian_golden():
  # s·exp(−d²/(2σ²)), σ = 0.5: d = 0 → s, d = 0.5 → s·e^{−1/2} = 0.606531 s, d = 1 → e^{−2} s.
  scores = np.array([[3.0, 3.5, 2.0, np.nan]], np.float32)
  out = gaussian_proximity(scores, np.array([3.0]), sigma=0.5, scale=2.0)
  np.testing.assert_allclose(out, [[2.0, 2 * 0.606531, 2 * 0.135335, 0.0]], rtol=1e-5)
  # σ = 1: d = 1 → e^{−1/2}.
  out = gaussian_proximity(np.array([[4.0]]), np.array([3.0]), sigma=1.0, scale=1.0)
  np.testing.assert_allclose(out, [[0.606531]], rtol=1e-5)


def test_format_weight_schedule():
  # T = 100: w = 1 up to t = 20, then 1 − 0.7·(t/T − 0.2)/0.8; t = 60 → 0.65; t = T → 0.3.
  # The last 0-based step t = 99 gets 0.3 + 0.7/80 = 0.30875; beyond T it stays at 0.3.
  expected = {-5: 1.0, 0: 1.0, 10: 1.0, 20: 1.0, 60: 0.65, 99: 0.30875, 100: 0.3, 250: 0.3}
  for t, w in expected.items():
    np.testing.assert_allclose(format_weight(t, 100), w, rtol=1e-6, err_msg=f"t = {t}")
  steps = jnp.arange(0, 101)
  traced = jax.jit(jax.vmap(lambda t: format_weight(t, 100)))(steps)
  np.testing.assert_allclose(traced, [float(format_weight(int(t), 100)) for t in steps], rtol=1e-6)
  assert np.all(np.diff(np.asarray(traced)) <= 0)
  # hold 0, final 0: a plain linear decay 1 − t/T.
  np.testing.assert_allclose(format_weight(25, 100, hold_fraction=0.0, final_weight=0.0), 0.75)
  with pytest.raises(ValueError, match="hold_fraction"):
    format_weight(0, 10, hold_fraction=1.0)


def test_total_reward_golden():
  # P0: the one valid rollout 3.5, σ² = 0; P1: [2, 2], σ² = 0; γ = 1e-6 → z = ±1.5/1e-3 and ±1e3:
  # r_rk = 1 for every valid rollout (P0 above P1, and each rollout on the right side).
  # Gaussian in score units: MOS 0.5 → 3.0, 0.25 → 2.0 on [1, 5]: r_gs = e^{−1/2}, -, 1, 1.
  # w_fmt(60/100) = 0.65. Row 1 rollout 0 is malformed (format 0) but parsed.
  scores = np.array([[3.5, np.nan], [2.0, 2.0]], np.float32)
  mos = np.array([0.5, 0.25], np.float32)
  fmt = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)
  out = total_reward(scores, mos, fmt, step=60, total_steps=100)
  np.testing.assert_allclose(out.ranking, [[1.0, 0.0], [1.0, 1.0]], atol=1e-6)
  np.testing.assert_allclose(out.proximity, [[0.606531, 0.0], [1.0, 1.0]], rtol=1e-5)
  np.testing.assert_array_equal(out.format, [[1.0, 0.0], [0.0, 1.0]])  # NaN score → no bonus
  np.testing.assert_allclose(out.format_weight, 0.65, rtol=1e-6)
  np.testing.assert_allclose(out.total, [[2.256531, 0.0], [2.0, 2.65]], rtol=1e-5)
  np.testing.assert_array_equal(out.valid, [[True, False], [True, True]])
  # Literal units: scores onto [0, 1], 3.5 → 0.625, d = 0.125: exp(−0.125²/0.5) = 0.969233.
  lit = total_reward(scores, mos, fmt, step=60, total_steps=100, gaussian_units="mos")
  np.testing.assert_allclose(lit.proximity, [[0.969233, 0.0], [1.0, 1.0]], rtol=1e-5)
  # α = 0 (the ranking-only ablation).
  abl = total_reward(scores, mos, fmt, step=60, total_steps=100, alpha=0.0)
  np.testing.assert_allclose(abl.total, [[1.65, 0.0], [1.0, 1.65]], rtol=1e-5)
  with pytest.raises(ValueError, match="gaussian_units"):
    total_reward(scores, mos, fmt, step=0, total_steps=1, gaussian_units="raw")
  with pytest.raises(KeyError, match="unknown ranking reward"):
    total_reward(scores, mos, fmt, step=0, total_steps=1, ranking="listnet")


def test_jit_equals_eager_and_vmap():
  scores = _random_batch(3)
  mos = np.linspace(0.0, 1.0, 6).astype(np.float32)
  ids = np.array([0, 1, 1, 2, 3, 4])
  fmt = (np.random.default_rng(3).uniform(size=scores.shape) > 0.3).astype(np.float32)

  # total_reward runs every jitted piece (fidelity, Thurstone, Gaussian, format weight) inside.
  def call():
    return total_reward(
      scores, mos, fmt, step=7, total_steps=20, prompt_ids=ids, hold_fraction=0.1, sigma=0.7
    )

  jitted = call()
  with jax.disable_jit():
    eager = call()
  for a, b in zip(jitted, eager):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(jitted.format_weight, 1.0 - 0.7 * (0.35 - 0.1) / 0.9, rtol=1e-6)
  # vmap over independent batches (e.g. one per dataset) equals a loop over them.
  stack = np.stack([_random_batch(s) for s in range(3)])
  mos_stack = np.stack([np.roll(mos, s) for s in range(3)])
  batched = jax.vmap(lambda s, m: thurstone_fidelity_reward(s, m, gamma=1e-3))(stack, mos_stack)
  for b in range(3):
    np.testing.assert_allclose(
      batched[b], thurstone_fidelity_reward(stack[b], mos_stack[b], gamma=1e-3), atol=1e-6
    )


def test_traced_step_compiles_once():
  traces = []

  @jax.jit
  def rewards(scores, mos, fmt, step):
    traces.append(1)
    return total_reward(scores, mos, fmt, step=step, total_steps=100).total

  scores, mos = _random_batch(4), np.linspace(0.0, 1.0, 6)
  fmt = np.ones_like(scores)
  outs = [rewards(scores, mos, fmt, jnp.int32(t)) for t in (0, 50, 100)]
  assert len(traces) == 1
  assert not np.allclose(outs[0], outs[2])


@pytest.mark.parametrize(
  "text, expected",
  [
    ("<pcqa_reasoning>ok</pcqa_reasoning><answer>3.5</answer>", 3.5),
    ("<answer>  4 </answer>", 4.0),
    ("<answer>\n2.25\n</answer>", 2.25),
    ("<answer>0.35e1</answer>", 3.5),
    ("<pcqa_reasoning>Surely a 2.</pcqa_reasoning><answer>4.2</answer>", 4.2),  # reasoning ignored
    ("<answer>3.1</answer><answer>4.9</answer>", 3.1),  # several answers: the first
    ("<answer><answer>4</answer></answer>", 4.0),  # nested: up to the first close tag
    ("<answer>x<answer>2.5</answer>", 2.5),
    ("<answer>Score: 3.75 / 5</answer>", 3.75),  # first number in the block
    ("<answer>7.5</answer>", 5.0),  # clamped to [1, 5]
    ("<answer>-2</answer>", 1.0),
    ("<answer>great</answer>", None),
    ("<answer></answer>", None),
    ("<answer>   </answer>", None),
    ("<answer>nan</answer>", None),
    ("<answer>NaN</answer>", None),
    ("<answer>inf</answer>", None),
    ("<answer>-inf</answer>", None),
    ("<answer>1e999</answer>", None),  # overflows to inf: not a score
    ("<answer>3.5", None),  # unclosed
    ("3.5", None),  # no answer block
    ("<ANSWER>3</ANSWER>", None),
    ("", None),
    (None, None),
    (3.5, None),
    (b"<answer>3</answer>", None),
  ],
)
def test_parse_score(text, expected):
  assert parse_score(text) == expected


def test_parse_score_without_clamping():
  assert parse_score("<answer>7.5</answer>", score_range=None) == 7.5
  assert parse_score("<answer>0.4</answer>", score_range=(0.0, 1.0)) == 0.4


@pytest.mark.parametrize(
  "text, expected",
  [
    ("<pcqa_reasoning>Smooth geometry, mild noise.</pcqa_reasoning><answer>3.9</answer>", 1.0),
    ("  <pcqa_reasoning>\nFine.\n</pcqa_reasoning>\n\n<answer> 3 </answer>\n<|im_end|>\n", 1.0),
    ("<think>\n\n</think>\n\n<pcqa_reasoning>Fine.</pcqa_reasoning><answer>3</answer>", 1.0),
    ("<pcqa_reasoning>几何结构完整</pcqa_reasoning><answer>4</answer>", 1.0),
    ("<pcqa_reasoning>Fine.</pcqa_reasoning><answer>good</answer>", 1.0),  # format only
    ("<pcqa_reasoning></pcqa_reasoning><answer>3</answer>", 0.0),
    ("<pcqa_reasoning>   </pcqa_reasoning><answer>3</answer>", 0.0),
    ("<pcqa_reasoning>3 4 ... 5!</pcqa_reasoning><answer>3</answer>", 0.0),  # no letter
    ("<pcqa_reasoning>Fine.</pcqa_reasoning>", 0.0),
    ("<pcqa_reasoning>Fine.</pcqa_reasoning><answer>3</answer><answer>4</answer>", 0.0),
    ("<pcqa_reasoning>Fine.</pcqa_reasoning><answer>3</answer> trailing words", 0.0),
    ("Preamble <pcqa_reasoning>Fine.</pcqa_reasoning><answer>3</answer>", 0.0),
    ("<pcqa_reasoning>A <b>bold</b> claim</pcqa_reasoning><answer>3</answer>", 0.0),
    ("<pcqa_reasoning>Fine.</pcqa_reasoning><answer><answer>3</answer></answer>", 0.0),
    ("<answer>3</answer><pcqa_reasoning>Fine.</pcqa_reasoning>", 0.0),
    ("<think>Fine.</think><answer>3</answer>", 0.0),
    (None, 0.0),
  ],
)
def test_format_reward(text, expected):
  assert format_reward(text) == expected


def test_parse_completions_counts_failures():
  good = "<pcqa_reasoning>Sharp edges.</pcqa_reasoning><answer>4.5</answer>"
  out = parse_completions([[good, "<answer>2</answer>"], ["<answer>nan</answer>", None]])
  np.testing.assert_array_equal(out.scores, [[4.5, 2.0], [np.nan, np.nan]])
  np.testing.assert_array_equal(out.format_ok, [[1.0, 0.0], [0.0, 0.0]])
  assert out.num_unparseable == 2 and out.scores.dtype == np.float32
  # Unparseable rollouts end with reward 0 and are counted in RewardTerms.valid too.
  terms = total_reward(out.scores, np.array([0.9, 0.1]), out.format_ok, step=0, total_steps=10)
  assert int(jnp.sum(~terms.valid)) == 2 and np.all(np.asarray(terms.total)[1] == 0.0)
  with pytest.raises(ValueError, match="same number of completions"):
    parse_completions([["a", "b"], ["c"]])


# ----------------------------------------------------------------------------------------------
# Quality metrics against scipy (imported inside the tests: scipy is a test-only dependency).
# ----------------------------------------------------------------------------------------------


def _metric_data(seed, n):
  rng = np.random.default_rng(seed)
  gt = np.round(rng.uniform(0.0, 1.0, n), 1)  # heavy ties
  pred = np.round(1.0 + 4.0 * gt + rng.normal(0.0, 0.6, n), 1)
  return gt, pred


@pytest.mark.parametrize("seed, n", [(0, 5), (1, 37), (2, 400), (3, 6000)])
def test_rank_correlations_match_scipy(seed, n):
  from scipy import stats

  gt, pred = _metric_data(seed, n)
  assert srcc(gt, pred) == pytest.approx(stats.spearmanr(gt, pred).statistic, abs=1e-12)
  assert krcc(gt, pred) == pytest.approx(stats.kendalltau(gt, pred).statistic, abs=1e-12)
  assert pearson(gt, pred) == pytest.approx(stats.pearsonr(gt, pred).statistic, abs=1e-12)
  np.testing.assert_allclose(average_ranks(pred), stats.rankdata(pred))


def test_rank_correlation_edge_cases():
  from scipy import stats

  assert krcc([1, 2, 3], [3, 2, 1]) == -1.0 and srcc([1, 2, 3], [3, 2, 1]) == -1.0
  x, y = [1.0, 1.0, 2.0, 2.0, 3.0], [5.0, 4.0, 4.0, 4.0, 1.0]  # ties on both sides
  assert krcc(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
  assert np.isnan(krcc([1, 1, 1], [1, 2, 3])) and np.isnan(srcc([1, 2, 3], [2, 2, 2]))
  assert np.isnan(pearson([1.0], [2.0]))
  with pytest.raises(ValueError, match="finite"):
    srcc([1.0, 2.0], [np.nan, 1.0])
  with pytest.raises(ValueError, match="differ in length"):
    krcc([1.0, 2.0], [1.0])


def _curve_fit_reference(gt, pred):
  """The released PCQA-R1 evaluation: curve_fit from (max gt, min gt, mean pred, 0.5)."""
  from scipy.optimize import curve_fit

  def f(x, b1, b2, b3, b4):
    return b2 + (b1 - b2) / (1 + np.exp(-(x - b3) / np.maximum(np.abs(b4), 1e-10)))

  p0 = [np.max(gt), np.min(gt), np.mean(pred), 0.5]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    params, _ = curve_fit(f, pred, gt, p0=p0, maxfev=100_000_000)
  return params, f(pred, *params)


@pytest.mark.parametrize(
  "seed, n, sign", [(0, 12, 1.0), (1, 60, 1.0), (2, 500, 1.0), (3, 80, -1.0)]
)
def test_logistic_fit_matches_curve_fit(seed, n, sign):
  from scipy import stats

  rng = np.random.default_rng(seed)
  pred = rng.uniform(1.0, 5.0, n)
  gt = np.clip(logistic4(pred, [0.95, 0.05, 3.0, sign * 0.6]) + rng.normal(0, 0.05, n), 0, 1)
  if sign < 0:
    gt = 1.0 - gt  # decreasing relation: the fit must find β1 < β2
  ref_params, ref_fitted = _curve_fit_reference(gt, pred)
  fit = logistic_fit(gt, pred)
  assert fit.converged and not fit.fell_back
  np.testing.assert_allclose(fit.params[:3], ref_params[:3], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(abs(fit.params[3]), abs(ref_params[3]), rtol=1e-4)
  np.testing.assert_allclose(fit.fitted, ref_fitted, atol=1e-6)
  metrics = quality_metrics.quality_metrics(gt, pred)
  assert metrics.plcc == pytest.approx(stats.pearsonr(gt, ref_fitted).statistic, abs=1e-9)
  assert metrics.rmse == pytest.approx(np.sqrt(np.mean((gt - ref_fitted) ** 2)), abs=1e-7)
  assert metrics.srcc == pytest.approx(stats.spearmanr(gt, pred).statistic, abs=1e-12)
  assert metrics.krcc == pytest.approx(stats.kendalltau(gt, pred).statistic, abs=1e-12)
  assert metrics.plcc_raw == pytest.approx(stats.pearsonr(gt, pred).statistic, abs=1e-12)
  assert not metrics.fit_fell_back and metrics.fit_converged and metrics.n == n


def test_logistic_fit_optimum_at_infinity_stays_close_to_curve_fit():
  # Predictions that saturate (tanh) against a uniform MOS: the least-squares logistic runs off
  # towards its exponential tail; both optimisers stop somewhere along the valley, and PLCC
  # barely moves there.
  from scipy import stats

  rng = np.random.default_rng(5)
  gt = rng.uniform(0.0, 1.0, 100)
  pred = 3.0 + 2.0 * np.tanh(3.0 * (gt - 0.5)) + rng.normal(0.0, 0.2, 100)
  _, ref_fitted = _curve_fit_reference(gt, pred)
  fit = logistic_fit(gt, pred)
  assert not fit.fell_back
  ours, ref = pearson(gt, fit.fitted), stats.pearsonr(gt, ref_fitted).statistic
  assert ours == pytest.approx(ref, abs=1e-4)
  assert np.sum((fit.fitted - gt) ** 2) <= np.sum((ref_fitted - gt) ** 2) * (1 + 1e-3)


def test_logistic_fit_falls_back_to_raw_predictions():
  # Fewer samples than parameters: curve_fit cannot run; PLCC / RMSE use the raw predictions.
  fit = logistic_fit([0.1, 0.5, 0.9], [1.0, 3.0, 5.0])
  assert fit.fell_back and not fit.converged and np.all(np.isnan(fit.params))
  np.testing.assert_array_equal(fit.fitted, [1.0, 3.0, 5.0])
  m = quality_metrics.quality_metrics([0.1, 0.5, 0.9], [1.0, 3.0, 5.0])
  assert m.fit_fell_back and m.plcc == m.plcc_raw
  assert m.rmse == pytest.approx(np.sqrt(np.mean(np.square([0.9, 2.5, 4.1]))))
  # A constant MOS is fitted exactly by the constant start (β1 = β2): PLCC undefined.
  flat = quality_metrics.quality_metrics([0.5] * 6, [1.0, 2.0, 3.0, 4.0, 5.0, 2.0])
  assert not flat.fit_fell_back and flat.rmse == 0.0 and np.isnan(flat.plcc)
