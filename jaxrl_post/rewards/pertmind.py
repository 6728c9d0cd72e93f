"""PertMind's path-supervised reward and per-query confidence weight (arXiv 2608.16419, §4.2).

  R(o) = R_gene(o) + λ_pw · m_pw · R_pw(o) + λ_fmt · R_fmt(o)

with R_gene ∈ {0, 1} (the final label is right), R_pw the mean directional accuracy over the
query's determinate pathways (uncertain ones excluded), m_pw = 1[#determinate > 0], R_fmt ∈
{0, 1} (all fields, legal labels, one terminal answer) and λ_pw, λ_fmt > 0, λ_pw + λ_fmt < 1:
then a wrong gene answer (R ≤ λ_pw + λ_fmt < 1) never outscores a right one (R ≥ 1).

The per-query objective is multiplied by `w_conf`; its formula is "not found" in the paper,
so this is a PROPOSAL (config `conf_scale`, `conf_min`):

  Up / Down:  c = min(1, −log10(q) / conf_scale)        (more significant: surer)
  No:         c = max(0, 1 − |Δ| / 0.20)                (closer to zero effect: surer)
  w_conf = conf_min + (1 − conf_min) · c  ∈ [conf_min, 1].

The GRPO side (`PertMindRewards`, config section `pertmind`): the step's rewards are
replaced by R, the advantages are the group z-score of R (`advantages.ADVANTAGES["grpo"]`, so a
zero-variance group gets A = 0 and no gradient) times each row's `w_conf`: the clipped
surrogate is linear in A, so this multiplies the query's policy objective by w_conf (the KL
term is not scaled; deviation noted in the docs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages import ADVANTAGES

LABELS = ("Up", "Down", "No")
NUM_PATHWAY_SLOTS = 3
# The completion's shape: `1:L 2:L 3:L ans:L` (tasks.perturbation_atlas.grammar_slots).
ANSWER_RE = re.compile(r"1:(Up|Down|No) 2:(Up|Down|No) 3:(Up|Down|No) ans:(Up|Down|No)")
_ANS_RE = re.compile(r"ans:(Up|Down|No)(?![A-Za-z])")


class Components(NamedTuple):
  """One completion's reward parts (`components`)."""

  gene: float  # R_gene ∈ {0, 1}
  pathway: float  # R_pw ∈ [0, 1] (0 when no pathway is determinate)
  has_pathway: float  # m_pw ∈ {0, 1}
  fmt: float  # R_fmt ∈ {0, 1}
  label: str | None  # the parsed final label


def parse(completion: str) -> tuple[list[str] | None, str | None, bool]:
  """`(pathway directions or None, final label or None, well formed)`.

  Well formed: the whole completion (surrounding whitespace stripped) is `1:L 2:L 3:L ans:L`.
  The final label is taken when exactly one `ans:<label>` occurs, even in a malformed reply.
  """
  if not isinstance(completion, str) or len(completion) > 1000:
    return None, None, False
  text = completion.strip()
  match = ANSWER_RE.fullmatch(text)
  if match:
    return list(match.groups()[:3]), match.group(4), True
  answers = _ANS_RE.findall(text)
  return None, (answers[0] if len(answers) == 1 else None), False


def components(record: Mapping[str, Any], completion: str) -> Components:
  """R_gene, R_pw, m_pw and R_fmt of `completion` for a `pertmind` record (never raises)."""
  meta = record.get("meta", "{}")
  meta = json.loads(meta) if isinstance(meta, str | bytes) else dict(meta)
  directions, label, fmt = parse(completion)
  gene = float(label is not None and label == record["answer"])
  gold = meta.get("pathway_labels", [])
  determinate = [j for j, lab in enumerate(gold) if lab in LABELS]
  has_pw = float(bool(determinate))
  pathway = 0.0
  if determinate and directions is not None:
    pathway = float(np.mean([directions[j] == gold[j] for j in determinate]))
  return Components(gene, pathway, has_pw, float(fmt), label)


def check_lambdas(lambda_pw: float, lambda_fmt: float, key: str = "config.pertmind") -> None:
  """λ_pw, λ_fmt ≥ 0 with λ_pw + λ_fmt < 1 (else a wrong gene answer could win).

  λ_pw = 0 is allowed: the gene-only ablation."""
  if lambda_pw < 0 or lambda_fmt < 0 or lambda_pw + lambda_fmt >= 1.0:
    raise ValueError(f"{key}.lambda_pw={lambda_pw} and {key}.lambda_fmt={lambda_fmt} must be "
                     "≥ 0 with lambda_pw + lambda_fmt < 1 (so a wrong gene answer never "
                     "outscores a right one)")


def pertmind_reward(gene, pathway, has_pathway, fmt, *, lambda_pw: float, lambda_fmt: float):
  """`R = R_gene + λ_pw · m_pw · R_pw + λ_fmt · R_fmt`, elementwise (arrays `[rows]`).

  >>> float(pertmind_reward(1.0, 0.5, 1.0, 1.0, lambda_pw=0.3, lambda_fmt=0.1))
  1.25
  """
  check_lambdas(lambda_pw, lambda_fmt, key="pertmind_reward")
  gene, pathway, has_pathway, fmt = (jnp.asarray(x, jnp.float32)
                                     for x in (gene, pathway, has_pathway, fmt))
  return gene + lambda_pw * has_pathway * pathway + lambda_fmt * fmt


def confidence_weight(label: str, delta: float, q: float, *, scale: float = 3.0,
                      minimum: float = 0.5) -> float:
  """PROPOSAL `w_conf ∈ [minimum, 1]` of a labelled query (module docstring).

  >>> confidence_weight("Up", 1.0, 1e-3), confidence_weight("No", 0.1, 0.9)
  (1.0, 0.75)
  """
  if scale <= 0 or not 0.0 <= minimum <= 1.0:
    raise ValueError(f"conf_scale={scale} must be > 0 and conf_min={minimum} in [0, 1]")
  if label in ("Up", "Down"):
    c = min(1.0, -np.log10(max(q, 1e-300)) / scale)
  elif label == "No":
    c = max(0.0, 1.0 - abs(delta) / 0.20)
  else:
    raise ValueError(f"label={label!r}; valid: {', '.join(LABELS)}")
  return float(minimum + (1.0 - minimum) * c)


def weighted_group_advantages(rewards, group_ids, weights, *, num_groups: int, eps: float = 1e-6):
  """`A_i = w_i · (R_i − mean_g R) / (std_g R + eps)`; a zero-variance group gives A = 0.

  `rewards`, `weights`: `[rows]`; `group_ids` `int32[rows]`.
  """
  adv = ADVANTAGES.get("grpo")(jnp.asarray(rewards, jnp.float32), jnp.asarray(group_ids),
                               num_groups=num_groups, eps=eps)
  return adv * jnp.asarray(weights, jnp.float32)


class PertMindRewards:
  """A `methods.step_parts` part (config section `pertmind`): PertMind's reward and w_conf.

  Its `rewards` hook replaces the verifier's advantages with `weighted_group_advantages` of R;
  `correct` / `format` stay the verifier's (R_gene, R_fmt), so `train/reward_correct` and the
  evaluation report gene accuracy. Logs `train/pertmind_reward`, `train/pertmind_pathway`.
  """

  def __init__(self, lambda_pw: float, lambda_fmt: float, use_conf: bool):
    check_lambdas(lambda_pw, lambda_fmt)
    self.lambda_pw, self.lambda_fmt, self.use_conf = lambda_pw, lambda_fmt, use_conf

  def rows(self, records: Sequence[Mapping[str, Any]], texts: Sequence[str], group_size: int):
    """`(R [rows], w_conf [rows], R_pw [rows])` for record-major rows."""
    parts, weights = [], []
    for i, text in enumerate(texts):
      record = records[i // group_size]
      parts.append(components(record, text))
      meta = json.loads(record["meta"]) if isinstance(record["meta"], str) else record["meta"]
      weights.append(meta.get("w_conf", 1.0) if self.use_conf else 1.0)
    gene, pathway, has_pw, fmt = (np.asarray([p[k] for p in parts], np.float32)
                                  for k in range(4))
    reward = np.asarray(pertmind_reward(gene, pathway, has_pw, fmt, lambda_pw=self.lambda_pw,
                                        lambda_fmt=self.lambda_fmt))
    return reward, np.asarray(weights, np.float32), pathway

  def rewards(self, method, ctx):
    config = method.config
    texts = method.sampler.decode_text(ctx.rollout)
    reward, weights, pathway = self.rows(ctx.records, texts, config.group_size)
    adv = weighted_group_advantages(reward, np.asarray(ctx.rollout.group_ids), weights,
                                    num_groups=len(ctx.records), eps=config.advantage_eps)
    verified = ctx.verified._replace(adv=adv)
    return verified, {"train/pertmind_reward": float(reward.mean()),
                      "train/pertmind_pathway": float(pathway.mean()),
                      "train/pertmind_w_conf": float(weights.mean())}


def build_pertmind(config) -> PertMindRewards | None:
  """The part of `config.pertmind` (`{lambda_pw, lambda_fmt, use_conf}`), or None when the
  section is absent or "none". Raises a ValueError naming the key on bad λ."""
  section = config.get("pertmind", "none")
  if section in (None, "none"):
    return None
  try:
    return PertMindRewards(float(section["lambda_pw"]), float(section["lambda_fmt"]),
                           bool(section.get("use_conf", True)))
  except KeyError as e:
    raise ValueError(f"config.pertmind needs lambda_pw and lambda_fmt, missing {e}") from None
