"""PertMind's synthetic perturbation atlas (`"pertmind"`): (cell line, drug, gene) → Up/Down/No.

PertMind (arXiv 2608.16419) turns Tahoe-100M pseudobulk statistics into an RL environment.
This is our PROPOSAL analogue, on CPU in a second:

* a random signed gene-regulatory graph `W [G, G]` whose edges fall mostly inside pathways
  (gene sets; every gene in 1–3 of them), so that a pathway's members move together;
* drugs with 1–3 target genes, each inhibited (−1) or activated (+1);
* cell lines that keep each edge with probability `edge_keep` and rescale the kept ones
  (log-normal), and have their own baseline expression `μ` per gene (some below 10);
* the response of drug d in line c: k-step signed propagation
  `x_{k+1} = x_0 + a · tanh(W_cᵀ x_k)` from the targets (`gain` = a), then `n_reps` noisy log2
  expression replicates of control and treated, a two-sample t-test per gene and
  Benjamini–Hochberg over the genes → `(Δ, q, μ)`;
* labels with EXACTLY the paper's thresholds (§4.1):
    Up    q ≤ 0.05 and Δ ≥ 0.585;   Down  q ≤ 0.05 and Δ ≤ −0.585;
    No    |Δ| < 0.20 and q ≥ 0.50 and μ ≥ 10;   else ambiguous (excluded);
* pathway proxy labels (reward side only) from the members of the pathway EXCLUDING g —
  PROPOSAL rule (the paper names the ingredients, not the formula): with `w_m = min(−log10 q_m,
  10)`, significance-weighted effect `e = Σ w_m Δ_m / Σ w_m`, active members `A` (q ≤ 0.05 and
  |Δ| ≥ 0.585), active fraction `f = |A| / members`, direction consistency `κ` = share of `A`
  whose sign is sign(e):
    Up / Down  if f ≥ `pw_min_active` and κ ≥ `pw_min_consistency` and e ≷ 0;
    No         if f == 0 and |e| < 0.20;   else uncertain (excluded from the reward).
  The paper's cross-condition consensus is not modelled.

Split by cell line: the last `num_test_lines` lines are the held-out "test" split; "train" is
every determinate triple of the others. Both are label-balanced (Up / Down / No interleaved).

Prompt: `c03 d11 g042 t:g005-,g017+ p:03,07,-` (query + knowledge tokens: the drug's targets
with their signs, the gene's ≤ 3 candidate pathways); never the statistics or proxy labels.
Completion (a `sampling.grammar` slots grammar, `grammar_slots`): `1:Up 2:No 3:Down ans:Up`,
pathway directions for the three listed pathways, then the gene's label. `reward` gives
`correct` = R_gene (the final label), `format` = R_fmt; `rewards.pertmind.components` the rest.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.stats

from jaxrl_post.rewards.pertmind import LABELS, NUM_PATHWAY_SLOTS, components, confidence_weight
from jaxrl_post.tasks import base

# §4.1 thresholds (exact).
Q_SIG, LFC_SIG, LFC_NULL, Q_NULL, MEAN_MIN = 0.05, 0.585, 0.20, 0.50, 10.0


def gene_label(delta: float, q: float, mean: float) -> str | None:
  """The §4.1 label of one gene's `(Δ = log2FC, q = padj, μ = baseMean)`; None: ambiguous.

  >>> gene_label(0.7, 0.01, 50), gene_label(-0.6, 0.05, 50), gene_label(0.1, 0.6, 12)
  ('Up', 'Down', 'No')
  >>> gene_label(0.1, 0.6, 9.0) is None, gene_label(0.5, 0.01, 50) is None
  (True, True)
  """
  if q <= Q_SIG and delta >= LFC_SIG:
    return "Up"
  if q <= Q_SIG and delta <= -LFC_SIG:
    return "Down"
  if abs(delta) < LFC_NULL and q >= Q_NULL and mean >= MEAN_MIN:
    return "No"
  return None


def pathway_label(delta: np.ndarray, q: np.ndarray, *, min_active: float = 0.2,
                  min_consistency: float = 0.7) -> str | None:
  """PROPOSAL proxy direction of a pathway from its members (g already excluded); None:
  uncertain (module docstring). `delta`, `q`: `[members]`."""
  if len(delta) == 0:
    return None
  w = np.minimum(-np.log10(np.maximum(q, 1e-300)), 10.0)
  effect = float(np.sum(w * delta) / max(np.sum(w), 1e-12))
  active = (q <= Q_SIG) & (np.abs(delta) >= LFC_SIG)
  frac = float(active.mean())
  if frac == 0.0:
    return "No" if abs(effect) < LFC_NULL else None
  consistency = float(np.mean(np.sign(delta[active]) == np.sign(effect)))
  if frac >= min_active and consistency >= min_consistency and effect != 0:
    return "Up" if effect > 0 else "Down"
  return None


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
  """BH-adjusted p-values (`q`), monotone, clipped to 1."""
  p = np.asarray(p, np.float64)
  n = len(p)
  order = np.argsort(p)
  ranked = p[order] * n / np.arange(1, n + 1)
  q = np.minimum.accumulate(ranked[::-1])[::-1]
  out = np.empty(n)
  out[order] = np.minimum(q, 1.0)
  return out


@dataclasses.dataclass(frozen=True)
class Atlas:
  """The generated atlas (arrays over lines c, drugs d, genes g; `Δ, q, μ` are `[C, D, G]`)."""

  delta: np.ndarray
  q: np.ndarray
  mean: np.ndarray
  targets: tuple  # per drug: ((gene, sign), ...)
  gene_pathways: tuple  # per gene: pathway ids (≤ 3)
  pathways: tuple  # per pathway: member gene ids


@functools.lru_cache(maxsize=8)
def build_atlas(seed: int, num_genes: int, num_pathways: int, num_drugs: int, num_lines: int,
                steps: int, noise: float, n_reps: int, edge_keep: float, gain: float = 1.5,
                density: float = 0.15) -> Atlas:
  """The atlas of the module docstring, a pure function of its arguments."""
  rng = np.random.default_rng(seed)
  g_n = num_genes
  # Pathways: each gene in 1-3 of them.
  membership = np.zeros((g_n, num_pathways), bool)
  for g in range(g_n):
    k = rng.integers(1, NUM_PATHWAY_SLOTS + 1)
    membership[g, rng.choice(num_pathways, k, replace=False)] = True
  same = (membership.astype(np.float32) @ membership.T.astype(np.float32)) > 0
  # Signed edges, mostly within pathways; each pathway has a dominant sign.
  pw_sign = rng.choice([-1.0, 1.0], num_pathways, p=[0.3, 0.7])
  prob = np.where(same, density, 0.01)
  edges = rng.random((g_n, g_n)) < prob
  np.fill_diagonal(edges, False)
  sign_pref = np.sign(membership @ pw_sign + 1e-3)[:, None]  # source gene's pathways' sign
  sign = np.where(rng.random((g_n, g_n)) < 0.85, sign_pref, -sign_pref)
  weight = edges * sign * rng.uniform(0.4, 1.0, (g_n, g_n))
  targets = []
  for _ in range(num_drugs):
    k = rng.integers(1, 4)
    genes = rng.choice(g_n, k, replace=False)
    targets.append(tuple((int(t), int(rng.choice([-1, 1]))) for t in genes))
  delta = np.zeros((num_lines, num_drugs, g_n))
  q = np.ones_like(delta)
  mean = np.zeros((num_lines, g_n))
  for c in range(num_lines):
    keep = rng.random((g_n, g_n)) < edge_keep
    w_c = weight * keep * rng.lognormal(0.0, 0.3, (g_n, g_n))
    mean[c] = np.exp(rng.normal(4.0, 1.3, g_n))  # baseMean; ≈ 3 % of genes below 10
    for d, tgt in enumerate(targets):
      x0 = np.zeros(g_n)
      for gene, s in tgt:
        x0[gene] = 2.0 * s
      x = x0.copy()
      for _ in range(steps):
        x = x0 + gain * np.tanh(w_c.T @ x)
      # Low-count genes are noisier (as in count data).
      sd = noise * (1.0 + 3.0 / np.sqrt(mean[c]))
      ctrl = rng.normal(0.0, 1.0, (n_reps, g_n)) * sd
      trt = x + rng.normal(0.0, 1.0, (n_reps, g_n)) * sd
      delta[c, d] = trt.mean(0) - ctrl.mean(0)
      p = scipy.stats.ttest_ind(trt, ctrl, axis=0).pvalue
      q[c, d] = benjamini_hochberg(np.nan_to_num(p, nan=1.0))
  pathways = tuple(tuple(int(g) for g in np.flatnonzero(membership[:, p]))
                   for p in range(num_pathways))
  gene_pathways = tuple(tuple(int(p) for p in np.flatnonzero(membership[g]))
                        for g in range(g_n))
  mean_cdg = np.broadcast_to(mean[:, None, :], delta.shape).copy()
  return Atlas(delta, q, mean_cdg, tuple(targets), gene_pathways, pathways)


@base.TASKS.register("pertmind")
@dataclasses.dataclass(frozen=True)
class PerturbationAtlasTask(base.Task):
  """The synthetic atlas as a verifiable task (module docstring).

  Knobs: the atlas' sizes, `num_test_lines` held-out lines, the proxy rule's thresholds,
  `pathway_labels` ("true", or "shuffled": the proxy labels permuted over the split's
  determinate pathway slots, the paper's control) and `conf_scale` / `conf_min` of the
  PROPOSAL confidence weight (`rewards.pertmind.confidence_weight`, stored in `meta`).
  """

  name = "pertmind"
  seed: int = 0
  num_genes: int = 60
  num_pathways: int = 12
  num_drugs: int = 16
  num_lines: int = 8
  num_test_lines: int = 2
  steps: int = 3
  noise: float = 0.35
  n_reps: int = 4
  edge_keep: float = 0.8
  gain: float = 1.5
  density: float = 0.15
  pw_min_active: float = 0.2
  pw_min_consistency: float = 0.7
  pathway_labels: str = "true"
  conf_scale: float = 3.0
  conf_min: float = 0.5

  def __post_init__(self):
    if self.pathway_labels not in ("true", "shuffled"):
      raise ValueError(f"task_knobs.pathway_labels={self.pathway_labels!r}; valid: true, "
                       "shuffled")
    if not 0 < self.num_test_lines < self.num_lines:
      raise ValueError(f"task_knobs.num_test_lines={self.num_test_lines} must be in "
                       f"[1, num_lines={self.num_lines})")

  @property
  def atlas(self) -> Atlas:
    return build_atlas(self.seed, self.num_genes, self.num_pathways, self.num_drugs,
                       self.num_lines, self.steps, self.noise, self.n_reps, self.edge_keep,
                       self.gain, self.density)

  def lines(self, split: str) -> list[int]:
    test = list(range(self.num_lines - self.num_test_lines, self.num_lines))
    if split == "test":
      return test
    if split == "train":
      return [c for c in range(self.num_lines) if c not in test]
    raise ValueError(f"pertmind has splits train / test, got {split!r}")

  @property
  def splits(self) -> list[str]:
    return ["train", "test"]

  def num_examples(self, split: str) -> int:
    return len(self._queries(split))

  def grammar_slots(self) -> list[list[str]]:
    """The completion grammar (`sampling.grammar.from_slots`): `1:L 2:L 3:L ans:L`."""
    labels = list(LABELS)
    return [["1:"], labels, [" 2:"], labels, [" 3:"], labels, [" ans:"], labels]

  def _pathway_labels(self, c: int, d: int, g: int) -> list[str | None]:
    atlas = self.atlas
    out = []
    for p in atlas.gene_pathways[g][:NUM_PATHWAY_SLOTS]:
      members = [m for m in atlas.pathways[p] if m != g]
      out.append(pathway_label(atlas.delta[c, d, members], atlas.q[c, d, members],
                               min_active=self.pw_min_active,
                               min_consistency=self.pw_min_consistency))
    return out + [None] * (NUM_PATHWAY_SLOTS - len(out))

  @functools.cache  # noqa: B019 (frozen dataclass: hashable, few instances)
  def _queries(self, split: str) -> tuple:
    """Label-balanced determinate triples `(c, d, g, label, pathway labels)` of `split`."""
    atlas = self.atlas
    by_label = {label: [] for label in LABELS}
    for c in self.lines(split):
      for d in range(self.num_drugs):
        for g in range(self.num_genes):
          label = gene_label(atlas.delta[c, d, g], atlas.q[c, d, g], atlas.mean[c, d, g])
          if label is not None:
            by_label[label].append((c, d, g, label, tuple(self._pathway_labels(c, d, g))))
    rng = np.random.default_rng([self.seed, 7, 0 if split == "train" else 1])
    for label in LABELS:
      rng.shuffle(by_label[label])
    n = min(len(v) for v in by_label.values())
    if n == 0:
      rare = min(by_label, key=lambda k: len(by_label[k]))
      raise ValueError(f"pertmind: split {split!r} has no {rare} labels; change the atlas knobs")
    queries = [by_label[label][i] for i in range(n) for label in LABELS]
    if self.pathway_labels == "shuffled":
      slots = [(i, j) for i, qu in enumerate(queries) for j, lab in enumerate(qu[4])
               if lab is not None]
      values = [queries[i][4][j] for i, j in slots]
      perm = rng.permutation(len(values))
      pw = [list(qu[4]) for qu in queries]
      for (i, j), k in zip(slots, perm):
        pw[i][j] = values[k]
      queries = [qu[:4] + (tuple(p),) for qu, p in zip(queries, pw)]
    return tuple(queries)

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    queries = self._queries(split)
    c, d, g, label, pw_labels = queries[index % len(queries)]
    atlas = self.atlas
    tgt = ",".join(f"g{t:03d}{'+' if s > 0 else '-'}" for t, s in atlas.targets[d])
    pws = list(atlas.gene_pathways[g][:NUM_PATHWAY_SLOTS])
    pw_text = ",".join([f"{p:02d}" for p in pws] + ["-"] * (NUM_PATHWAY_SLOTS - len(pws)))
    prompt = f"c{c:02d} d{d:02d} g{g:03d} t:{tgt} p:{pw_text}\n"
    delta, q, mean = (float(atlas.delta[c, d, g]), float(atlas.q[c, d, g]),
                      float(atlas.mean[c, d, g]))
    w_conf = float(confidence_weight(label, delta, q, scale=self.conf_scale,
                                     minimum=self.conf_min))
    demo_pw = [lab if lab is not None else label for lab in pw_labels]
    demonstration = " ".join(f"{i + 1}:{lab}" for i, lab in enumerate(demo_pw)) + f" ans:{label}"
    meta = dict(cell_line=c, drug=d, gene=g, delta=delta, q=q, mean=mean, w_conf=w_conf,
                pathways=pws, pathway_labels=[lab or "uncertain" for lab in pw_labels])
    return base.make_record(self.name, index, prompt, label, demonstration, meta)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    parts = components(record, completion)
    return base.Reward(parts.gene, parts.fmt)
