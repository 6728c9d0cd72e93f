"""PCQA-R1 (arXiv 2608.18627) on synthetic point clouds: one stage or method per run.

PCQA-R1 trains a multimodal LM to rate point-cloud quality with GRPO on

  r^(k) = r_rk^(k) + w_fmt(t)·r_fmt + α·r_gs^(k)          (`rewards.ranking.total_reward`)

after a one-epoch cold start on templated rationales ("PCQA-CoT"), and evaluates PLCC / SRCC
within and across datasets (`rewards.quality_metrics`). A run is one `config.method`:

  base        SFT on the rationale template with random words and scores (the format stage)
  capable     SFT on the templated rationales (a capable start, from base)
  cold_start  `cold_start_steps` of SFT on the rationales (full's first half)
  sft         SFT on the rationales for the whole budget (cold start + RL steps)
  rank        GRPO with the Thurstone fidelity reward only (α = 0)
  rank_gauss  GRPO with ranking + Gaussian proximity (α = 1)
  full        GRPO with ranking + Gaussian (α = 1) from a cold_start run: PCQA-R1
  regression  the trunk + a scalar head, MSE on the normalised MOS (`losses.regression`)

and every run but base starts from another's workdir (`config.init_from`: configs/
pcqa_synthetic.py's `sweep` and scripts/pcqa_grid.py give the order). One step:

  SFT         a batch of views → target completions → `losses.nll_loss` → one update
  GRPO        a batch of views → K rollouts → parse scores → PCQA-R1 rewards → group
              advantages (`rewards.ranking.rollout_rewards`) → reference log-probs → one update
              of the clipped objective with a k3 KL (`losses.policy_loss`)
  regression  a batch of views → ŷ → `losses.regression.mse_loss` → one update

Evaluation: greedy answers (or ŷ) on the test splits of all datasets → PLCC after the
4-parameter logistic, SRCC, per dataset and averaged in-domain + OOD and OOD only; the last
evaluation also goes to `workdir/final.json` (scripts/pcqa_table.py reads it).

The rest of this module is the method's text and model glue:

* Text: `PROMPT`, the completion template
    <pcqa_reasoning>{object}, {degradation}, {band}.</pcqa_reasoning><answer>{score:.1f}</answer>
  and the score scale: the model writes ŷ ∈ [1, 5]; a dataset's MOS normalised to [0, 1]
  maps to 1 + 4·MOS₀₁ (`mos_to_score`).
* Cold-start rationales (`cot_completion`): the fixed order of the paper's PCQA-CoT traces in
  miniature — object cue, dominant degradation and its severity, coarse quality band — written
  from hidden metadata and the MOS ("reverse reasoning"), with the MOS only in `<answer>`.
* The "base" format stage's targets (`base_completion`): the rationale template with random
  words and a *random* score. It stands in for the pretrained LMM of the paper, which already
  follows the output format but has never seen quality labels; the "no cold start" RL variants
  start from it.
* Jitted functions of the model's graphdef (`Kernels`): sampling K rollouts from the multimodal
  prompt (`kernels.prefill` with `embeddings=`, `kernels.decode` on the LM), teacher-forced
  scoring (`scoring.score_model` with `prompt_embeddings=`), and the model-level losses for
  `train_state.make_train_step`: SFT NLL, GRPO (`losses.policy_loss`, token level, ε = 0.2,
  β = 0.04, k3 KL to the reference policy) and the regression baseline's MSE.
* `evaluate_lm` / `evaluate_regressor` (greedy answers → `quality_metrics` per dataset; an
  unparseable answer falls back to the middle of the scale, 3.0, as the released inference
  code does, and is counted).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import losses
from jaxrl_post.losses.regression import mse_loss
from jaxrl_post.models import get_model_config
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, axis_rules
from jaxrl_post.parallel.mesh import init_sharded, put_batch
from jaxrl_post.rewards import quality_metrics as qm
from jaxrl_post.rewards import ranking
from jaxrl_post.sampling import kernels, scoring
from jaxrl_post.tasks import point_clouds as pc
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.train_state import make_train_step

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


# Data stages: each draws its batches with its own RNG stream (`PCQA.batch_index`).
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
  """`(model, batch) -> (nll, aux)`: token-mean NLL over the batch's `num_tokens`.

  `losses.nll_loss` of the completion tokens after the multimodal prompt; the batch holds
  `views [n, V, G, G, C]`, `completion_tokens/mask [n, T]` and the global `num_tokens`.
  """

  def loss(model, batch):
    scored = score_rows(model, text_tokens, batch["views"], batch["completion_tokens"],
                        batch["completion_mask"])
    nll = losses.nll_loss(scored.logp, batch["completion_mask"], batch["num_tokens"])
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
  """`(model, batch) -> (mse, aux)`: `losses.regression.mse_loss` of ŷ against MOS₀₁.

  The absolute-regression baseline: the same encoder and LM trunk, a scalar head on the last
  prompt position, regressed on the source dataset's normalised MOS.
  """

  def loss(model, batch):
    pred = model.regress(batch["views"], _prompt_rows(text_tokens, batch["views"].shape[0]))
    mse = mse_loss(pred, batch["mos01"], batch["num_sequences"])
    return mse, {"mse": mse}

  return loss


class Kernels(NamedTuple):
  """Jitted functions of one model graph (views are placed on the mesh `build_kernels` got)."""

  sample: Callable  # (params, views [b, ...], rng) -> DecodeOutput with b·K rows.
  greedy: Callable  # (params, views [b, ...]) -> DecodeOutput with b rows.
  score: Callable  # (params, views, completion_tokens, completion_mask) -> logp [n, T].
  regress: Callable  # (params, views) -> [b] scalar predictions.


def build_kernels(graphdef, text_tokens: np.ndarray, *, num_samples: int, max_new_tokens: int,
                  eos_id: int, pad_id: int, temperature: float = 1.0, mesh: Mesh | None = None,
                  rules: Rules = DEFAULT_RULES) -> Kernels:
  """Sampling, greedy decoding, scoring and regression as jitted functions of the params.

  Sampling: the prompt row is built with the current encoder, prefilled once into the LM's KV
  cache (`kernels.prefill(..., embeddings=row)`), copied for the K samples, and decoded from
  `nnx.split(model.lm)`; the decode's per-token log-probs equal `score` on the same rows.
  With a `mesh`, the views' rows are split over its batch axes (`put_batch`) and the model's
  activation constraints apply (`axis_rules`); the params keep the sharding they come with.
  """
  text_tokens = jnp.asarray(text_tokens, jnp.int32)
  no_ids = jnp.zeros((0,), jnp.int32)

  def context():
    return axis_rules(mesh, rules) if mesh is not None else contextlib.nullcontext()

  def put(x):
    return x if mesh is None else put_batch(x, mesh, rules)

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
    with context():
      return _decode(params, views, rng, n=num_samples, greedy=False)

  @jax.jit
  def greedy(params, views):
    with context():
      return _decode(params, views, jax.random.key(0), n=1, greedy=True)

  @jax.jit
  def score(params, views, completion_tokens, completion_mask):
    with context():
      model = nnx.merge(graphdef, params)
      return score_rows(model, text_tokens, views, completion_tokens, completion_mask,
                        temperature=temperature).logp

  @jax.jit
  def regress(params, views):
    with context():
      model = nnx.merge(graphdef, params)
      return model.regress(views, _prompt_rows(text_tokens, views.shape[0]))

  return Kernels(
    sample=lambda params, views, rng: sample(params, put(views), rng),
    greedy=lambda params, views: greedy(params, put(views)),
    score=lambda params, views, tokens, mask: score(params, *put((views, tokens, mask))),
    regress=lambda params, views: regress(params, put(views)))


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
    out = multihost.to_host(k.greedy(params, _padded(views, index, batch_size)))
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
    out = multihost.to_host(k.sample(params, _padded(views, index, batch_size),
                                     jax.random.fold_in(rng, c)))
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
  preds = [multihost.to_host(k.regress(params, _padded(views, index, batch_size)))[:len(index)]
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


# ---- The method ----

# What each `config.method` trains: its update ("sft" / "grpo" / "regression"), its data stage
# (batch RNG stream), its SFT target kind and its Gaussian weight α.
KINDS = {"base": "sft", "capable": "sft", "cold_start": "sft", "sft": "sft", "rank": "grpo",
         "rank_gauss": "grpo", "full": "grpo", "regression": "regression"}
STAGES = {"base": STAGE_BASE, "capable": STAGE_CAPABLE, "cold_start": STAGE_SFT,
          "sft": STAGE_SFT, "rank": STAGE_GRPO, "rank_gauss": STAGE_GRPO, "full": STAGE_GRPO,
          "regression": STAGE_REGRESSION}
ALPHAS = {"rank": 0.0, "rank_gauss": 1.0, "full": 1.0}


def method_steps(config) -> int:
  """The steps `config.method` trains (configs/pcqa_synthetic.py sets `config.steps` to it).

  base `base_steps`; capable `capable_steps`; cold_start `cold_start_steps`; sft the budget
  `cold_start_steps + rl_steps`; rank / rank_gauss / full `rl_steps` (full's cold start is its
  own run); regression `capable_steps + cold_start_steps + rl_steps` from base: the same number
  of steps after base as capable + sft, without the rationale SFT.
  """
  budget = config.cold_start_steps + config.rl_steps
  return {"base": config.base_steps, "capable": config.capable_steps,
          "cold_start": config.cold_start_steps, "sft": budget, "rank": config.rl_steps,
          "rank_gauss": config.rl_steps, "full": config.rl_steps,
          "regression": config.capable_steps + budget}[config.method]


class PCQA:
  """One PCQA-R1 stage or method on synthetic point clouds (configs/pcqa_synthetic.py); a
  `training.loop.Method`."""

  name = "pcqa"
  updates_per_step = 1

  def __init__(self, config):
    if config.method not in KINDS:
      raise ValueError(f"config.method={config.method!r}; valid: {', '.join(KINDS)}")
    self.config, self.method, self.kind = config, config.method, KINDS[config.method]
    if config.steps != method_steps(config):
      raise ValueError(
        f"config.steps={config.steps} but config.method={self.method!r} trains "
        f"{method_steps(config)} steps: pick the method with the config argument "
        f"(configs/pcqa_synthetic.py:method={self.method}), which also picks its optimizer")
    if self.method != "base" and not (config.init_from or config.resume):
      raise ValueError(f"config.init_from: method {self.method!r} starts from another run's "
                       "workdir (configs/pcqa_synthetic.py's sweep; scripts/pcqa_grid.py sets it)")

  # ---- Set-up ----

  def build_model(self, run: loop.Run):
    """Loads the data (the source's train split, every dataset's test split) and the model,
    its parameters born sharded on the trainer's mesh (they carry logical axis names)."""
    config = self.config
    names = config.datasets.split(",")
    if config.source not in names:
      raise ValueError(f"config.source={config.source!r} is not in config.datasets={names}")
    for name in names:
      pc.DATASETS.get(name)  # unknown names fail here, listing the valid ones
    grid = config.encoder.grid
    self.train = pc.load_split(config.source, "train", size=config.train_size or None,
                               num_points=config.num_points, grid=grid)
    self.test = {d: pc.load_split(d, "test", size=config.test_size or None,
                                  num_points=config.num_points, grid=grid) for d in names}
    if config.batch_size > len(self.train.mos):
      raise ValueError(f"config.batch_size={config.batch_size} exceeds the "
                       f"{len(self.train.mos)} training samples")
    # With `capable_holdout` > 0 the capable stage and the methods after it draw from disjoint
    # parts of the source train split (`holdout_pools`).
    try:
      self.pools = holdout_pools(len(self.train.mos), config.capable_holdout
                                 if config.capable_steps else 0, config.batch_size)
    except ValueError as e:
      raise ValueError(f"config.capable_holdout: {e}") from None
    self.tokenizer = get_tokenizer(config.tokenizer)
    lm_config = get_model_config(config.model, vocab_size=self.tokenizer.vocab_size,
                                 **dict(config.model_overrides))
    encoder = config.encoder

    def make():
      return PointCloudLM(lm_config, num_views=pc.NUM_VIEWS, grid=grid, patch=encoder.patch,
                          channels=len(pc.CHANNELS), width=encoder.width, depth=encoder.depth,
                          rngs=nnx.Rngs(config.seed))

    return init_sharded(make, run.train_mesh, run.train_rules)

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    text_tokens = np.asarray(self.tokenizer.encode(PROMPT), np.int32)
    text, g = jnp.asarray(text_tokens), config.grpo
    loss_fn, shared = {
      "sft": (make_sft_loss(text), ("num_tokens", "num_sequences")),
      "grpo": (make_grpo_loss(text, epsilon=g.epsilon, beta=g.beta, kl_estimator=g.kl_estimator,
                              temperature=g.temperature), ("num_tokens", "num_sequences")),
      "regression": (make_regression_loss(text), ("num_sequences",)),
    }[self.kind]
    self.step_fn = make_train_step(run.graphdef, loss_fn, run.optimizer, mesh=run.train_mesh,
                                   rules=run.train_rules, shared=shared)
    self.kernels = build_kernels(run.graphdef, text_tokens, num_samples=g.num_samples,
                                 max_new_tokens=config.completion_len,
                                 eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
                                 temperature=g.temperature, mesh=run.train_mesh,
                                 rules=run.train_rules)
    # π_ref: the policy GRPO starts from (the starting point, also after a restart).
    self.reference = (jax.tree.map(jnp.copy, state.params) if self.kind == "grpo" else None)
    self.rng = jax.random.key(config.seed + 1)
    self.started = time.perf_counter()

  def state_dict(self) -> dict[str, Any]:
    # Nothing: a step's batch and rollout keys are functions of (seed, stage, step).
    return {}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

  def put(self, batch):
    return put_batch(batch, self.run.train_mesh, self.run.train_rules)

  def batch_index(self, step: int) -> tuple[np.ndarray, np.random.Generator]:
    """Rows of the train split for 0-based `step` of this run's data stage, and the RNG that
    drew them (the base stage's random targets continue it)."""
    config, stage = self.config, STAGES[self.method]
    rng = np.random.default_rng([config.seed, stage, step])
    pool = self.pools.get(stage)
    num_train = len(self.train.mos)
    if pool is None:
      return np.sort(rng.choice(num_train, config.batch_size, replace=False)), rng
    return np.sort(pool[rng.choice(len(pool), config.batch_size, replace=False)]), rng

  # ---- One step ----

  def step(self, state, step: int):
    return {"sft": self.sft_step, "grpo": self.grpo_step,
            "regression": self.regression_step}[self.kind](state, step - 1)

  def sft_step(self, state, i: int):
    index, rng = self.batch_index(i)
    batch = ppo.with_normalizers(sft_batch(
      self.tokenizer, self.train, index, completion_len=self.config.completion_len,
      kind="base" if self.method == "base" else "cot", rng=rng))
    state, metrics = self.step_fn(state, self.put(batch))
    return state, {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}

  def grpo_step(self, state, i: int):
    config, g = self.config, self.config.grpo
    tic = time.perf_counter()
    index, _ = self.batch_index(i)
    views = self.train.views[index]
    # K rollouts per prompt; their per-token log-probs are the old policy's.
    out = multihost.to_host(self.kernels.sample(state.params, views,
                                                jax.random.fold_in(self.rng, i)))
    texts = decode_completions(self.tokenizer, out.tokens, out.mask)
    rewards = ranking.rollout_rewards(
      texts, self.train.mos01[index], num_samples=g.num_samples, step=i,
      total_steps=config.steps, alpha=ALPHAS[self.method], sigma=g.sigma, scale=g.scale,
      gamma=g.gamma, hold_fraction=g.hold_fraction, final_weight=g.final_weight,
      gaussian_units=g.gaussian_units, adv_eps=g.adv_eps, score_range=SCORE_RANGE,
      mos_range=MOS_RANGE)
    rows = np.repeat(views, g.num_samples, axis=0)
    ref_logp = multihost.to_host(self.kernels.score(self.reference, rows, out.tokens, out.mask))
    batch = ppo.with_normalizers(dict(views=rows, completion_tokens=out.tokens,
                                      completion_mask=out.mask, old_logp=out.logp,
                                      ref_logp=ref_logp, adv=rewards.adv))
    state, metrics = self.step_fn(state, self.put(batch))
    terms, valid = rewards.terms, np.asarray(rewards.terms.valid)
    record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    record.update({
      "reward/total": float(np.mean(terms.total)),
      "reward/ranking": float(np.mean(terms.ranking)),
      "reward/proximity": float(np.mean(terms.proximity)),
      "reward/format": float(np.mean(terms.format)),
      "reward/format_weight": float(terms.format_weight),
      "reward/unparseable": rewards.num_unparseable / valid.size,
      "rollout/score_std_within": float(np.nanmean(np.nanstd(
        np.where(valid, rewards.scores, np.nan), axis=1))) if valid.any() else 0.0,
      "rollout/length": float(np.mean(out.mask.sum(1))),
      "time/step": time.perf_counter() - tic, "rollout/example": texts[0]})
    return state, record

  def regression_step(self, state, i: int):
    index, _ = self.batch_index(i)
    batch = dict(views=self.train.views[index],
                 mos01=np.asarray(self.train.mos01[index], np.float32),
                 num_sequences=np.float32(len(index)))
    state, metrics = self.step_fn(state, self.put(batch))
    return state, {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}

  # ---- Evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, Any]:
    config = self.config
    tic = time.perf_counter()
    if self.kind == "regression":
      result = evaluate_regressor(self.kernels, state.params, self.test, source=config.source,
                                  batch_size=config.eval_batch)
    else:
      result = evaluate_lm(self.kernels, state.params, self.tokenizer, self.test,
                           source=config.source, batch_size=config.eval_batch)
    result["time/eval"] = time.perf_counter() - tic
    if step == config.steps and jax.process_index() == 0:
      # The run's result (scripts/pcqa_table.py); `time/run` counts since this process started
      # the method (a restarted run's last stretch only).
      final = dict(result, **{"time/run": time.perf_counter() - self.started})
      (self.run.workdir / "final.json").write_text(json.dumps(final, indent=1) + "\n")
    return {f"eval/{k}": v for k, v in result.items()}

  def progress(self, record):
    if self.kind == "grpo":
      return {"r": record["reward/total"], "rk": record["reward/ranking"]}
    return {"nll" if self.kind == "sft" else "mse": record["train/loss"]}

  def summary(self, records) -> str:
    evals = [r for r in records if "eval/avg/plcc" in r]
    if not evals:
      return ""
    last, source = evals[-1], self.config.source

    def value(key):  # NaN (a constant predictor's correlation) comes back as text
      return float(last.get(f"eval/{key}", "nan"))

    return (f"seed {self.config.seed} {self.method} step {last['step']}: ID PLCC/SRCC "
            f"{value(f'{source}/plcc'):.3f}/{value(f'{source}/srcc'):.3f}  OOD-avg "
            f"{value('ood_avg/plcc'):.3f}/{value('ood_avg/srcc'):.3f}")
