"""Prompt templates of the MLREF proposer (arXiv 2608.18827, Algorithm 1).

The paper's exact prompts are in its "Technical Supplement", which we could not find
(NOT FOUND); these templates follow the stages the paper names: task reflection and environment
reflection (no code), feedback reflection in three situations (failed / regressed / new best),
module-spec generation for the initial pool (4–6 modules), per-module code, an improvement plan of
ADD / DELETE / MODIFY / REWRITE with rationale, and module selection with weights.

Templates are `str.format` strings; `render` fills them and checks nothing is left unfilled.
Replies are asked for as one fenced ```json or ```python block, parsed by `extract_json` /
`extract_code`.
"""

from __future__ import annotations

import json
import math
import re
import string
from typing import Any, Mapping, Sequence

from jaxrl_post.rewards import module_code

SYSTEM = """\
You are an expert reward engineer for reinforcement learning. You design rewards as a pool of
small, reusable reward modules; the trained reward is R = sum_k w_k * m_k over selected modules.
Be concrete and concise."""

MODULE_CONTRACT = """\
A reward module is exactly one Python function of the feature dict `f`, for example:

```python
def upright_bonus(f):
  \"\"\"Reward keeping the torso upright.\"\"\"
  tilt = jnp.abs(f["torso_angle"])
  return jnp.exp(-4.0 * jnp.square(tilt))
```

Rules (anything else is rejected automatically):
- `f["name"]` has shape [batch, *feature_shape]; return one float per sample, shape [batch].
- Only: assignments to local names, arithmetic, single comparisons, a final `return`, constant
  indexing/slicing such as x[..., 0], and calls of these jnp functions: {jnp_functions},
  jnp.linalg.norm; constants jnp.pi, jnp.e.
- No imports, no other names or builtins, no if/for/while (use jnp.where), no None/newaxis.
- Keep outputs finite for all inputs, including all-zero features (guard divisions and logs).
- Available features (name: per-sample shape — meaning):
{features}"""

TASK_REFLECTION = """\
Task:
{task}

Reflect on the task (no code): what does success mean, which behaviours lead to it, which
intermediate signals indicate progress, and which failure modes or reward hacks should a reward
avoid? Answer in at most {max_words} words."""

ENVIRONMENT_REFLECTION = """\
Environment:
{environment}

Features available to reward modules:
{features}

Reflect on the environment (no code): which features measure progress on the task, which are
noisy or misleading, what scales and ranges they have, and how they relate to each other.
Answer in at most {max_words} words."""

FEEDBACK_REFLECTION = {
    "failed": """\
Task:
{task}

Feedback on the last round (iteration {iteration}): every pool variant performed worse than the
best so far by more than the tolerance, so the pool was rolled back.
{feedback}

Reflect (no code): why did the changes hurt, which modules or weights should be avoided, and what
should the next improvement try instead? At most {max_words} words.""",
    "regressed": """\
Task:
{task}

Feedback on the last round (iteration {iteration}): the variants did not beat the best reward so
far, but some stayed within tolerance and were merged.
{feedback}

Reflect (no code): what held performance back, which modules look useful or harmful from their
credits, and what should change next? At most {max_words} words.""",
    "new_best": """\
Task:
{task}

Feedback on the last round (iteration {iteration}): a new best reward was found.
{feedback}

Reflect (no code): what made it better, which modules carry the improvement, and how can it be
pushed further without breaking what works? At most {max_words} words.""",
}

INIT_SPECS = """\
Task:
{task}

Reflection:
{reflection}

{contract}

Design the initial module pool (variant {variant} of {num_variants}; make it distinct from what
other variants would likely do). Propose {min_modules} to {max_modules} modules, each one
focused reward component. Reply with one JSON block only:
```json
{{"modules": [{{"name": "snake_case_name", "description": "what it rewards and why"}}]}}
```"""

MODULE_CODE = """\
Task:
{task}

Reflection:
{reflection}

{contract}

Write the code of module `{name}`: {description}
Reply with one ```python block that defines `def {name}(f):` and nothing else."""

MODIFY_CODE = """\
Task:
{task}

Reflection:
{reflection}

{contract}

Module `{name}` currently is:
```python
{code}
```
Make this targeted change: {description}
Reply with one ```python block that defines `def {name}(f):` and nothing else."""

IMPROVE_PLAN = """\
Task:
{task}

Reflection:
{reflection}

Current pool (name, version, credits; s = composite score, n = times selected):
{pool}

{contract}

Plan an improvement of this pool (variant {variant} of {num_variants}). Operations:
ADD (new module), DELETE (remove a useless or harmful module), MODIFY (targeted edit of an
existing module), REWRITE (re-implement an existing module from scratch). Use 1 to {max_ops}
operations and give a rationale. Reply with one JSON block only:
```json
{{"rationale": "...", "ops": [{{"op": "ADD|DELETE|MODIFY|REWRITE", "name": "module_name",
  "description": "for ADD/REWRITE: what the module rewards; for MODIFY: the change to make"}}]}}
```"""

SELECT_WEIGHTS = """\
Task:
{task}

Reflection:
{reflection}

Module pool:
{pool}

Select at most {k} modules for the reward R = sum_k w_k * m_k and give each a non-negative
weight (they will be normalised to sum 1; unselected modules get 0). Reply with one JSON block:
```json
{{"weights": {{"module_name": 0.5}}}}
```"""


def render(template: str, **values: Any) -> str:
  """`template.format(**values)`, failing loudly on a missing or unused placeholder."""
  fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
  missing = fields - values.keys()
  if missing:
    raise KeyError(f"template needs {sorted(missing)}")
  return template.format(**{k: values[k] for k in fields})


def format_features(feature_spec: Mapping[str, Sequence[int]],
                    feature_docs: Mapping[str, str] | None = None,
                    feature_stats: Mapping[str, Sequence[float]] | None = None) -> str:
  """One line per feature: `name: shape — doc (typical value mean ± std ...)`.

  Args:
    feature_spec: feature name → per-sample shape.
    feature_docs: feature name → meaning and units.
    feature_stats: feature name → (mean, std) of the feature under random actions (a scalar
      summary: vector features give the mean over components); non-finite entries are left out.
  """
  docs, stats = feature_docs or {}, feature_stats or {}
  lines = []
  for name, shape in feature_spec.items():
    text = docs.get(name, "")
    st = stats.get(name)
    if st is not None and all(math.isfinite(float(x)) for x in st):
      per = " per component" if tuple(shape) else ""
      typical = f"(typical value{per} {float(st[0]):.3g} ± {float(st[1]):.3g} under random actions)"
      text = f"{text} {typical}" if text else typical
    lines.append(f"  - {name}: {tuple(shape)} — {text}".rstrip(" —"))
  return "\n".join(lines)


def contract(feature_spec: Mapping[str, Sequence[int]],
             feature_docs: Mapping[str, str] | None = None,
             feature_stats: Mapping[str, Sequence[float]] | None = None) -> str:
  return render(MODULE_CONTRACT, jnp_functions=", ".join(sorted(module_code.ALLOWED_JNP)),
                features=format_features(feature_spec, feature_docs, feature_stats))


_FENCE = re.compile(r"```([a-zA-Z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
  """The first ```python (or unlabelled) fenced block, else the whole text stripped."""
  for lang, body in _FENCE.findall(text):
    if lang.lower() in ("python", "py", ""):
      return body.strip("\n")
  return text.strip()


def extract_json(text: str) -> Any:
  """The first ```json block (or the first {...} span) parsed as JSON.

  Raises:
    ValueError: no parseable JSON object in `text`.
  """
  candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
  start, end = text.find("{"), text.rfind("}")
  if start != -1 and end > start:
    candidates.append(text[start:end + 1])
  for c in candidates:
    try:
      return json.loads(c)
    except json.JSONDecodeError:
      continue
  raise ValueError(f"no JSON object in reply: {text[:200]!r}")
