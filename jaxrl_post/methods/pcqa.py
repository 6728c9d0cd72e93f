"""PCQA-R1 training glue: prompts, templated rationales, SFT / GRPO / regression steps, evaluation.

PCQA-R1 (arXiv 2608.18627) trains a multimodal LM to rate point-cloud quality with GRPO on

  r^(k) = r_rk^(k) + w_fmt(t)·r_fmt + α·r_gs^(k)          (`rewards.ranking.total_reward`)

after a one-epoch cold start on templated rationales ("PCQA-CoT"), and evaluates PLCC / SRCC
within and across datasets (`rewards.quality_metrics`). This module holds the pieces between the
data (`tasks.point_clouds`), the model (`models.point_cloud.PointCloudLM`) and the experiment
binary (`experiments/pcqa.py`):

* Text: `PROMPT`, the completion template
    <pcqa_reasoning>{object}, {degradation}, {band}.</pcqa_reasoning><answer>{score:.1f}</answer>
  and the score scale: the model writes ŷ ∈ [1, 5]; a dataset's MOS normalised to [0, 1]
  maps to 1 + 4·MOS₀₁ (`mos_to_score`).
* Cold-start rationales (`cot_completion`): the fixed order of the paper's PCQA-CoT traces in
  miniature — object cue, dominant degradation and its severity, coarse quality band — written
  from hidden metadata and the MOS ("reverse reasoning"), with the MOS only in `<answer>`.
* A "base" format stage (`base_completion`): the rationale template with random words and a
  *random* score. It stands
  in for the pretrained LMM of the paper, which already follows the output format but has never
  seen quality labels; the "no cold start" RL variants start from it.
* Jitted functions built once per process from the model's graphdef (`Kernels`): sampling K
  rollouts from the multimodal prompt (`kernels.prefill` with `embeddings=`, `kernels.decode` on
  the LM), teacher-forced scoring (`scoring.score_model` with `prompt_embeddings=`), and the
  losses for `train_state.make_train_step`: SFT NLL, GRPO (`losses.policy_loss`, token level,
  ε = 0.2, β = 0.04, k3 KL to the reference policy) and the MSE of the regression baseline.
* `rollout_rewards` (parse → `total_reward` → group advantages) and `evaluate_lm` /
  `evaluate_regressor` (greedy answers → `quality_metrics` per dataset; an unparseable answer
  falls back to the middle of the scale, 3.0, as the released inference code does, and is counted).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post import losses
from jaxrl_post.advantages import group_advantages
from jaxrl_post.rewards import quality_metrics as qm
from jaxrl_post.rewards import ranking
from jaxrl_post.sampling import kernels, scoring
from jaxrl_post.tasks import point_clouds as pc

PROMPT = "Rate quality 1-5:"
SCORE_RANGE = ranking.SCORE_RANGE  # (1, 5): the scale the model writes.
MOS_RANGE = ranking.MOS_RANGE  # (0, 1): every dataset's MOS after normalisation.
FALLBACK_SCORE = 3.0  # Unparseable answers at evaluation (the released inference code).
QUALITY_BANDS = ("bad", "poor", "fair", "good", "excellent")
DEGRADATION_WORDS = {"noise": "noise", "downsample": "sparse", "quantize": "blocky",
                     "colour_noise": "speckle"}
_SEVERITY = ("clean", "slight", "mild", "clear", "strong", "severe")
_TAG = ranking.REASONING_TAG


def mos_to_score(mos01: np.ndarray | float) -> np.ndarray:
  """ŷ = 1 + 4·MOS₀₁: normalised MOS onto the model's 1–5 scale."""
  lo, hi = SCORE_RANGE
  return lo + (hi - lo) * np.asarray(mos01, np.float64)


def quality_band(mos01: float) -> str:
  """The coarse band of a normalised MOS: five equal bins of [0, 1].

  Examples:
    >>> quality_band(0.05), quality_band(0.5), quality_band(1.0)
    ('bad', 'fair', 'excellent')
  """
  return QUALITY_BANDS[int(np.clip(np.floor(mos01 * len(QUALITY_BANDS)), 0,
                                   len(QUALITY_BANDS) - 1))]


def completion(reasoning: str, score: float) -> str:
  """`<pcqa_reasoning>{reasoning}</pcqa_reasoning><answer>{score:.1f}</answer>`."""
  return f"<{_TAG}>{reasoning}</{_TAG}><answer>{score:.1f}</answer>"


def cot_completion(shape: str, distortion: str, severity: int, mos01: float) -> str:
  """The cold-start target: object cue, dominant degradation, band; the score only in <answer>.

  Examples:
    >>> cot_completion("torus", "noise", 4, 0.3)
    '<pcqa_reasoning>torus, strong noise, poor.</pcqa_reasoning><answer>2.2</answer>'
    >>> cot_completion("cube", "none", 0, 0.97)
    '<pcqa_reasoning>cube, clean, excellent.</pcqa_reasoning><answer>4.9</answer>'
  """
  if distortion == "none":
    degradation = "clean"
  else:
    degradation = f"{_SEVERITY[severity]} {DEGRADATION_WORDS[distortion]}"
  return completion(f"{shape}, {degradation}, {quality_band(mos01)}.",
                    float(mos_to_score(mos01)))


def base_completion(rng: np.random.Generator) -> str:
  """The format stage's target: the rationale template filled with *random* words and score.

  Object, degradation, severity, band and score are drawn independently (score uniform on
  [1, 5]), so the model learns the output format and the vocabulary of the rationales but
  nothing about the mapping from views to quality: the stand-in for a pretrained LMM that
  follows the prompt's format but has never seen quality labels.
  """
  shape = pc.SHAPES[rng.integers(len(pc.SHAPES))]
  severity = int(rng.integers(pc.NUM_SEVERITIES + 1))
  distortion = "none" if severity == 0 else pc.DISTORTIONS[rng.integers(len(pc.DISTORTIONS))]
  text = cot_completion(shape, distortion, severity, float(rng.uniform()))
  score = float(rng.uniform(*SCORE_RANGE))
  return text[:text.index("<answer>")] + f"<answer>{score:.1f}</answer>"


def encode_completions(tokenizer, texts: Sequence[str], completion_len: int
                       ) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded completion tokens + EOS, `[n, completion_len]`; raises if one does not fit."""
  tokens = np.full((len(texts), completion_len), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(texts), completion_len), bool)
  for i, text in enumerate(texts):
    ids = tokenizer.encode(text) + [tokenizer.eos_id]
    if len(ids) > completion_len:
      raise ValueError(f"completion of {len(ids)} tokens (with EOS) exceeds "
                       f"config.completion_len={completion_len}: {text!r}")
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = True
  return tokens, mask


def decode_completions(tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
  """Texts of sampled completions (masked tokens only, EOS and pads dropped)."""
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  return [tokenizer.decode([int(t) for t in row[m]]) for row, m in zip(tokens, mask)]


# Data stages of experiments/pcqa.py: each draws its batches with its own RNG stream.
STAGE_BASE, STAGE_SFT, STAGE_GRPO, STAGE_REGRESSION, STAGE_CAPABLE = 0, 1, 2, 3, 4


def holdout_pools(num_train: int, holdout: float, batch_size: int = 1) -> dict[int, np.ndarray]:
  """Train-split indices per data stage for a capable start with held-out RL prompts.

  The capable stage gets the first `num_train − round(holdout · num_train)` samples, the
  methods after it (SFT / cold start, GRPO) the rest, so that they train on clouds the capable
  policy has not memorised; stages without a pool (base, regression) use the whole split.
  Batches are drawn without replacement, so each side must hold at least `batch_size`.

  Returns:
    `{stage: int indices}`; empty when `holdout` is 0.
  """
  num_held = int(round(holdout * num_train))
  if not num_held:
    return {}
  if min(num_held, num_train - num_held) < batch_size:
    raise ValueError(f"holdout={holdout} of {num_train} training clouds leaves "
                     f"{num_train - num_held} for the capable stage and {num_held} after it, "
                     f"fewer than batch_size={batch_size} on one side")
  held = np.arange(num_train - num_held, num_train)
  return {STAGE_CAPABLE: np.arange(num_train - num_held), STAGE_SFT: held, STAGE_GRPO: held}


def sft_batch(tokenizer, data: pc.DatasetArrays, index: np.ndarray, *, completion_len: int,
              kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Views and target completions of rows `index`: `kind` "cot" (cold start) or "base"."""
  if kind == "cot":
    texts = [cot_completion(data.shape[i], data.distortion[i], int(data.severity[i]),
                            float(data.mos01[i])) for i in index]
  elif kind == "base":
    texts = [base_completion(rng) for _ in index]
  else:
    raise ValueError(f"unknown SFT target kind {kind!r}; valid: cot, base")
  tokens, mask = encode_completions(tokenizer, texts, completion_len)
  return dict(views=data.views[index], completion_tokens=tokens, completion_mask=mask)


def _prompt_rows(text_tokens: jax.Array, batch: int) -> jax.Array:
  return jnp.broadcast_to(text_tokens[None], (batch, text_tokens.shape[0]))


def score_rows(model, text_tokens: jax.Array, views: jax.Array, completion_tokens: jax.Array,
               completion_mask: jax.Array, *, temperature: float = 1.0) -> scoring.ScoreOutput:
  """Teacher-forced log-probs of completions after the multimodal prompt (differentiable).

  The prompt row is `model.prompt_embeddings(views, text)`; it has no padding (the text prompt
  is fixed), so its mask is all True and the tokens passed beside it only give its length.
  """
  b = views.shape[0]
  row = model.prompt_embeddings(views, _prompt_rows(text_tokens, b))
  prompt_tokens = jnp.zeros(row.shape[:2], jnp.int32)
  return scoring.score_model(model.lm, prompt_tokens, jnp.ones(row.shape[:2], jnp.bool_),
                             completion_tokens, completion_mask, temperature=temperature,
                             prompt_embeddings=row)


def make_sft_loss(text_tokens: jax.Array) -> Callable:
  """`(model, batch) -> (nll, aux)`: token-mean NLL over the batch's `num_tokens`."""

  def loss(model, batch):
    scored = score_rows(model, text_tokens, batch["views"], batch["completion_tokens"],
                        batch["completion_mask"])
    nll = -jnp.sum(scored.logp) / batch["num_tokens"]
    return nll, {"nll": nll}

  return loss


def make_grpo_loss(text_tokens: jax.Array, *, epsilon: float = 0.2, beta: float = 0.04,
                   kl_estimator: str = "k3", loss_agg_mode: str = "token-mean",
                   temperature: float = 1.0) -> Callable:
  """`(model, batch) -> (loss, aux)`: clipped GRPO with a KL penalty to the reference policy.

  J = E[min(ρ_t A, clip(ρ_t, 1 − ε, 1 + ε) A)] − β·KL_k3(π_θ ‖ π_ref)     (ε = 0.2, β = 0.04)

  token-level ratios ρ_t = π_θ/π_old (the spec's PROPOSAL; the paper prints a sequence-level
  ratio). The batch holds `views [n, V, G, G, C]`, `completion_tokens/mask [n, T]`, `old_logp`,
  `ref_logp` `[n, T]`, `adv [n]` and the global `num_tokens` / `num_sequences`.
  """

  def loss(model, batch):
    scored = score_rows(model, text_tokens, batch["views"], batch["completion_tokens"],
                        batch["completion_mask"], temperature=temperature)
    value, aux = losses.policy_loss(
      scored.logp, batch["old_logp"], batch["adv"], batch["completion_mask"],
      loss_agg_mode=loss_agg_mode, epsilon_low=epsilon, epsilon_high=epsilon,
      ref_logp=batch["ref_logp"], beta=beta, kl_estimator=kl_estimator,
      num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"])
    return value, {"pg_loss": aux.pg_loss, "kl": aux.kl, "clip_frac": aux.clip_frac_low +
                   aux.clip_frac_high, "ratio_mean": aux.ratio_mean}

  return loss


def make_regression_loss(text_tokens: jax.Array) -> Callable:
  """`(model, batch) -> (mse, aux)`: (ŷ − MOS₀₁)² summed over rows / the global `num_sequences`.

  The absolute-regression baseline: the same encoder and LM trunk, a scalar head on the last
  prompt position, regressed on the source dataset's normalised MOS.
  """

  def loss(model, batch):
    pred = model.regress(batch["views"], _prompt_rows(text_tokens, batch["views"].shape[0]))
    mse = jnp.sum(jnp.square(pred - batch["mos01"])) / batch["num_sequences"]
    return mse, {"mse": mse}

  return loss


class Kernels(NamedTuple):
  """Jitted functions of one model graph, built once and reused by every run of a process."""

  sample: Callable  # (params, views [b, ...], rng) -> DecodeOutput with b·K rows.
  greedy: Callable  # (params, views [b, ...]) -> DecodeOutput with b rows.
  score: Callable  # (params, views, completion_tokens, completion_mask) -> logp [n, T].
  regress: Callable  # (params, views) -> [b] scalar predictions.


def build_kernels(graphdef, text_tokens: np.ndarray, *, num_samples: int, max_new_tokens: int,
                  eos_id: int, pad_id: int, temperature: float = 1.0) -> Kernels:
  """Sampling, greedy decoding, scoring and regression as jitted functions of the params.

  Sampling: the prompt row is built with the current encoder, prefilled once into the LM's KV
  cache (`kernels.prefill(..., embeddings=row)`), copied for the K samples, and decoded from
  `nnx.split(model.lm)`; the decode's per-token log-probs equal `score` on the same rows.
  """
  text_tokens = jnp.asarray(text_tokens, jnp.int32)
  no_ids = jnp.zeros((0,), jnp.int32)

  def _decode(params, views, rng, *, n, greedy):
    model = nnx.merge(graphdef, params)
    b = views.shape[0]
    row = model.prompt_embeddings(views, _prompt_rows(text_tokens, b))
    tokens = jnp.zeros(row.shape[:2], jnp.int32)
    mask = jnp.ones(row.shape[:2], jnp.bool_)
    lm_graphdef, lm_state = nnx.split(model.lm)
    start = kernels.prefill(lm_graphdef, lm_state, tokens, mask,
                            cache_len=row.shape[1] + max_new_tokens, num_samples=n,
                            embeddings=row)
    return kernels.decode(lm_graphdef, lm_state, start, rng, max_new_tokens=max_new_tokens,
                          eos_ids=jnp.asarray([eos_id], jnp.int32), stop_ids=no_ids,
                          pad_id=pad_id, temperature=temperature, top_p=1.0, top_k=0,
                          greedy=greedy, num_logprobs=0)

  @jax.jit
  def sample(params, views, rng):
    return _decode(params, views, rng, n=num_samples, greedy=False)

  @jax.jit
  def greedy(params, views):
    return _decode(params, views, jax.random.key(0), n=1, greedy=True)

  @jax.jit
  def score(params, views, completion_tokens, completion_mask):
    model = nnx.merge(graphdef, params)
    return score_rows(model, text_tokens, views, completion_tokens, completion_mask,
                      temperature=temperature).logp

  @jax.jit
  def regress(params, views):
    model = nnx.merge(graphdef, params)
    return model.regress(views, _prompt_rows(text_tokens, views.shape[0]))

  return Kernels(sample, greedy, score, regress)


class RolloutRewards(NamedTuple):
  """Rewards of one GRPO step's rollouts."""

  terms: ranking.RewardTerms  # [B, K] terms of `total_reward`.
  adv: np.ndarray  # [B·K] float32 group-normalised advantages (row p·K + k).
  scores: np.ndarray  # [B, K] parsed scores, NaN = unparseable.
  num_unparseable: int


def rollout_rewards(texts: Sequence[str], mos01: np.ndarray, *, num_samples: int, step: int,
                    total_steps: int, alpha: float, sigma: float = 0.5, scale: float = 1.0,
                    gamma: float = 1e-6, hold_fraction: float = 0.2, final_weight: float = 0.3,
                    gaussian_units: str = "score", adv_eps: float = 1e-6) -> RolloutRewards:
  """Completions (prompt-major, K per prompt) → PCQA-R1 rewards and GRPO advantages.

  A_i^(k) = (r_i^(k) − mean_k r_i) / (std_k r_i + ε) over the K rollouts of prompt i.
  An unparseable rollout gets r = 0 (every term), so the advantage pushes it down.
  """
  b = len(mos01)
  if len(texts) != b * num_samples:
    raise ValueError(f"{len(texts)} completions for {b} prompts × K={num_samples}")
  parsed = ranking.parse_completions(
    [texts[i * num_samples:(i + 1) * num_samples] for i in range(b)], score_range=SCORE_RANGE)
  terms = ranking.total_reward(
    parsed.scores, jnp.asarray(mos01, jnp.float32), parsed.format_ok, step=step,
    total_steps=total_steps, gamma=gamma, sigma=sigma, scale=scale, alpha=alpha,
    hold_fraction=hold_fraction, final_weight=final_weight, gaussian_units=gaussian_units,
    mos_range=MOS_RANGE, score_range=SCORE_RANGE)
  groups = jnp.repeat(jnp.arange(b, dtype=jnp.int32), num_samples)
  adv = group_advantages(terms.total.reshape(-1), groups, num_groups=b, eps=adv_eps)
  return RolloutRewards(terms, np.asarray(adv, np.float32), parsed.scores,
                        parsed.num_unparseable)


def _chunks(n: int, size: int):
  for start in range(0, n, size):
    yield np.arange(start, min(start + size, n))


def _padded(views: np.ndarray, index: np.ndarray, size: int) -> np.ndarray:
  """Rows `index` padded to `size` rows by repeating the last (one compiled shape)."""
  rows = np.concatenate([index, np.full(size - len(index), index[-1])])
  return views[rows]


def predict_lm(k: Kernels, params, tokenizer, views: np.ndarray, *, batch_size: int
               ) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """Greedy answers on `views`: (scores with the 3.0 fall-back, unparseable mask, texts)."""
  texts: list[str] = []
  for index in _chunks(len(views), batch_size):
    out = k.greedy(params, _padded(views, index, batch_size))
    texts += decode_completions(tokenizer, out.tokens, out.mask)[:len(index)]
  scores = np.asarray([ranking.parse_score(t, score_range=SCORE_RANGE) for t in texts],
                      dtype=object)
  bad = np.asarray([s is None for s in scores])
  return np.where(bad, FALLBACK_SCORE, scores).astype(np.float64), bad, texts


def predict_lm_sampled(k: Kernels, params, tokenizer, views: np.ndarray, *, batch_size: int,
                       num_samples: int, rng: jax.Array
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean of K sampled answers per cloud: (means with the 3.0 fall-back, no-valid mask, scores).

  `k.sample` must draw `num_samples` rollouts per prompt (its K and temperature are fixed when
  `build_kernels` compiles it). Unparseable samples are dropped from a cloud's mean; a cloud
  with no parseable sample falls back to `FALLBACK_SCORE` and is flagged in the mask. Chunk c
  samples with `fold_in(rng, c)`, so a fixed `rng` (and batch size) gives fixed predictions.
  `scores` is `[n, K]` with NaN for unparseable samples.
  """
  texts: list[str] = []
  for c, index in enumerate(_chunks(len(views), batch_size)):
    out = k.sample(params, _padded(views, index, batch_size), jax.random.fold_in(rng, c))
    rows = decode_completions(tokenizer, out.tokens, out.mask)
    if len(rows) != batch_size * num_samples:
      raise ValueError(f"k.sample drew {len(rows)} rows for {batch_size} prompts; expected "
                       f"K={num_samples} per prompt (build_kernels(num_samples=...))")
    texts += rows[:len(index) * num_samples]
  parsed = [ranking.parse_score(t, score_range=SCORE_RANGE) for t in texts]
  scores = np.asarray([np.nan if s is None else s for s in parsed],
                      np.float64).reshape(len(views), num_samples)
  valid = np.isfinite(scores)
  none = ~valid.any(axis=1)
  means = np.where(none, FALLBACK_SCORE,
                   np.nansum(scores, axis=1) / np.maximum(valid.sum(axis=1), 1))
  return means, none, scores


def predict_regressor(k: Kernels, params, views: np.ndarray, *, batch_size: int) -> np.ndarray:
  preds = [np.asarray(k.regress(params, _padded(views, index, batch_size)))[:len(index)]
           for index in _chunks(len(views), batch_size)]
  return np.concatenate(preds).astype(np.float64)


def dataset_metrics(mos: np.ndarray, pred: np.ndarray) -> dict[str, float]:
  """PLCC (after the 4-parameter logistic), SRCC, KRCC and RMSE of one dataset."""
  m = qm.quality_metrics(mos, pred)
  return {"plcc": m.plcc, "srcc": m.srcc, "krcc": m.krcc, "rmse": m.rmse}


def summarize(per_dataset: Mapping[str, Mapping[str, float]], source: str) -> dict[str, float]:
  """Flat metrics: `<dataset>/<metric>`, plus `avg/…` (all datasets) and `ood_avg/…`."""
  out = {f"{d}/{k}": v for d, m in per_dataset.items() for k, v in m.items()}
  for name, keep in (("avg", lambda d: True), ("ood_avg", lambda d: d != source)):
    chosen = [m for d, m in per_dataset.items() if keep(d)]
    if chosen:
      for key in ("plcc", "srcc"):
        out[f"{name}/{key}"] = float(np.mean([m[key] for m in chosen]))
  return out


def evaluate_lm(k: Kernels, params, tokenizer, test: Mapping[str, pc.DatasetArrays], *,
                source: str, batch_size: int, mode: str = "greedy", num_samples: int = 8,
                rng: jax.Array | None = None) -> dict[str, Any]:
  """PLCC / SRCC per dataset and averaged; unparseable answers counted per dataset.

  `mode="greedy"`: one greedy answer per cloud (`predict_lm`); `<d>/unparseable` is the share
  of clouds whose answer fell back to 3.0. `mode="sampled_mean"`: the mean of `num_samples`
  sampled answers (`predict_lm_sampled`; `k` must be built with that K and the sampling
  temperature, `rng` is required); `<d>/unparseable` is the share of clouds with no parseable
  sample (fall-back 3.0) and `<d>/unparseable_samples` the share of unparseable samples.
  """
  if mode not in ("greedy", "sampled_mean"):
    raise ValueError(f"unknown evaluation mode {mode!r}; valid: greedy, sampled_mean")
  if mode == "sampled_mean" and rng is None:
    raise ValueError("mode='sampled_mean' needs an rng")
  per_dataset, extra = {}, {}
  for i, (name, data) in enumerate(test.items()):
    if mode == "greedy":
      pred, bad, _ = predict_lm(k, params, tokenizer, data.views, batch_size=batch_size)
    else:
      pred, bad, scores = predict_lm_sampled(k, params, tokenizer, data.views,
                                             batch_size=batch_size, num_samples=num_samples,
                                             rng=jax.random.fold_in(rng, i))
      extra[f"{name}/unparseable_samples"] = float(np.mean(~np.isfinite(scores)))
      some = np.isfinite(scores).any(axis=1)  # spread of the K scores of a cloud
      extra[f"{name}/sample_std_within"] = (
        float(np.mean(np.nanstd(scores[some], axis=1))) if some.any() else 0.0)
    per_dataset[name] = dataset_metrics(data.mos, pred)
    extra[f"{name}/unparseable"] = float(np.mean(bad))
    extra[f"{name}/score_std"] = float(np.std(pred))
  return summarize(per_dataset, source) | extra


def evaluate_regressor(k: Kernels, params, test: Mapping[str, pc.DatasetArrays], *,
                       source: str, batch_size: int) -> dict[str, Any]:
  per_dataset = {name: dataset_metrics(data.mos, predict_regressor(k, params, data.views,
                                                                   batch_size=batch_size))
                 for name, data in test.items()}
  return summarize(per_dataset, source)


def _correlations(final: Mapping[str, Any], datasets: Sequence[str]) -> dict[str, float]:
  """Per-dataset PLCC / SRCC of one run; an undefined correlation of a constant predictor is 0.

  A policy that writes the same score for every test sample (score std ≤ 1e-9: the float64
  std of identical values is ~4e-16, not 0) has no ranking ability, but its correlations are
  0/0 = NaN (or a meaningless fall-back of the logistic fit), which would drop it from every
  average; it counts as 0 instead, and `<dataset>/constant` says so. Other NaNs stay NaN.
  """
  out = {}
  for d in datasets:
    constant = final.get(f"{d}/score_std", 1.0) <= 1e-9
    out[f"{d}/constant"] = float(constant)
    for m in ("plcc", "srcc"):
      out[f"{d}/{m}"] = 0.0 if constant else final.get(f"{d}/{m}", float("nan"))
  return out


def aggregate_runs(workdir, methods: Sequence[str], datasets: Sequence[str], *,
                   source: str, filename: str = "final.json") -> dict[str, dict[str, Any]]:
  """Mean and std over seeds of each method's `final.json` under `workdir/seed_*/<method>/`.

  Per run, PLCC / SRCC per dataset (`_correlations`: a constant predictor counts 0), their
  average over all datasets (`avg/…`) and over the targets other than `source` (`ood_avg/…`);
  then mean and population std over seeds. Also the unparseable and constant-prediction shares
  and the run time.

  Returns:
    `{method: {metric: [mean, std], "num_seeds": n}}`.
  """
  table: dict[str, dict[str, Any]] = {}
  for method in methods:
    finals = [json.loads(p.read_text())
              for p in sorted(Path(workdir).glob(f"seed_*/{method}/{filename}"))]
    if not finals:
      continue
    runs = []
    for final in finals:
      run = _correlations(final, datasets)
      for name, chosen in (("avg", datasets), ("ood_avg", [d for d in datasets if d != source])):
        for m in ("plcc", "srcc"):
          run[f"{name}/{m}"] = float(np.mean([run[f"{d}/{m}"] for d in chosen]))
      for key in ["time/run", *(f"{d}/unparseable" for d in datasets)]:
        if key in final:
          run[key] = final[key]
      runs.append(run)
    row: dict[str, Any] = {"num_seeds": len(finals)}
    for key in runs[0]:
      values = [r[key] for r in runs if key in r]
      row[key] = [float(np.mean(values)), float(np.std(values))]
    table[method] = row
  return table


def format_table(table: Mapping[str, Mapping[str, Any]], datasets: Sequence[str], *,
                 source: str) -> str:
  """A markdown table: PLCC / SRCC per dataset (mean ± std over seeds), OOD average."""
  cols = [f"{d}{' (ID)' if d == source else ''}" for d in datasets] + ["OOD avg", "all avg"]
  lines = ["| method | seeds | " + " | ".join(cols) + " |",
           "|---|---|" + "---|" * len(cols)]
  for method, row in table.items():
    cells = []
    for prefix in [*datasets, "ood_avg", "avg"]:
      p, s = row.get(f"{prefix}/plcc"), row.get(f"{prefix}/srcc")
      cells.append("–" if p is None else f"{p[0]:.3f}±{p[1]:.3f} / {s[0]:.3f}±{s[1]:.3f}")
    lines.append(f"| {method} | {row['num_seeds']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
