"""methods/reflect_rl.py: the arithmetic golden negatives, the JSONL source, the step's prompts
(exactly K_t reflective rows per group, the first K_t), the mixed-group advantage, the
schedule wiring, the method state and the config errors (each naming its key)."""

import doctest
import json
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post import losses
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import grpo, reflect_rl
from jaxrl_post.methods.grpo import policy_objective
from jaxrl_post.parallel.axes import DEFAULT_RULES
from jaxrl_post.sampling import Rollout
from jaxrl_post.tasks import arithmetic
from jaxrl_post.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "{prompt}A wrong solution:\n{negative}\nFind the error, then answer:\n"
# One column of the worked solution: `a+b+carry=s`, `[1]a-b-borrow=d` or `a*d+carry=p`.
COLUMN = re.compile(r"^(1?\d+)([-+*])(\d+)[-+](\d+)=(\d+)$")


def _config(arg="runlocal", **reflect):
  config = load_module(ROOT / "configs" / "reflect_rl.py").get_config(arg)
  config.reflect.update(reflect)
  return config


def _record(expression):
  value = eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and + - * only (tests)
  return {"prompt": f"Q: {expression}=\n", "index": 0, "answer": str(value),
          "meta": json.dumps({"expression": expression})}




def test_doctests():
  result = doctest.testmod(reflect_rl, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted >= 6 and result.failed == 0
  finder = doctest.DocTestFinder()
  (test,) = finder.find(arithmetic.ArithmeticTask.golden_negative, "golden_negative",
                        globs=vars(arithmetic))
  runner = doctest.DocTestRunner()
  runner.run(test)
  assert runner.summarize().failed == 0


# ---- golden negatives of the arithmetic task ----


def _slipped_column(exact_lines, negative_lines):
  """The first line where the two differ, its index, and the first differing column."""
  j = next(i for i, (a, b) in enumerate(zip(exact_lines, negative_lines)) if a != b)
  head_e, _, cols_e = exact_lines[j].partition(": ")
  head_n, _, cols_n = negative_lines[j].partition(": ")
  assert head_e == head_n, (exact_lines[j], negative_lines[j])
  cols_e, cols_n = cols_e.split(", "), cols_n.split(", ")
  c = next(i for i, (a, b) in enumerate(zip(cols_e, cols_n)) if a != b)
  return j, cols_e[:c] == cols_n[:c], cols_e[c], cols_n[c]


@pytest.mark.parametrize("knobs", [dict(max_digits=2, operations="+-"),
                                   dict(max_digits=3, num_operands=3, operations="+-*")])
def test_golden_negative_is_the_solution_with_one_carry_dropped_and_a_wrong_answer(knobs):
  task = arithmetic.ArithmeticTask(**knobs)
  seen = 0
  for i in range(300):
    record = task.make_example("train", i)
    negative = task.golden_negative(record)
    if negative is None:
      continue
    seen += 1
    reward = task.reward(record, negative)
    assert (reward.correct, reward.format) == (0.0, 1.0), negative  # well formed, wrong
    exact = record["demonstration"].splitlines()  # demo_slip = 0: the exact solution
    lines = negative.splitlines()
    j, same_before, exact_col, slipped_col = _slipped_column(exact, lines)
    # A valid prefix: every line and column before the slip equals the correct solution's.
    assert lines[:j] == exact[:j] and same_before
    # The slip: the column's incoming carry / borrow (non-zero in the solution) is written 0.
    e, n = COLUMN.match(exact_col), COLUMN.match(slipped_col)
    assert e and n, (exact_col, slipped_col)
    assert int(e.group(4)) > 0 and int(n.group(4)) == 0
    assert e.group(2, 3) == n.group(2, 3) and e.group(1)[-1] == n.group(1)[-1]
  assert seen > 50


def test_golden_negative_is_none_without_a_carry_that_changes_the_answer():
  task = arithmetic.ArithmeticTask()
  for expression in ("12+34", "58-23", "21*3", "0+0", "9-9"):
    assert task.golden_negative(_record(expression)) is None, expression
  # 15*2 carries (5*2 = 10), but the wrong product is then multiplied by 0: the answer stays
  # right, so no golden negative.
  assert task.golden_negative(_record("15*2*0")) is None
  assert task.golden_negative(_record("15*2*1")) is not None


def test_golden_negative_first_and_seeded_choices():
  task = arithmetic.ArithmeticTask()
  # Two slip points: the carries into the tens and the hundreds (the top column's sum is
  # written whole). 987+654 = 1641; without the first carry 1631, without the second 1541.
  record = _record("987+654")
  first = task.golden_negative(record)
  assert first.splitlines() == ["987+654: 7+4+0=11, 8+5+0=13, 9+6+1=16", "987+654=1631",
                                "#### 1631"]
  seeded = {task.golden_negative(record, seed=s) for s in range(20)}
  assert len(seeded) == 2 and first in seeded
  assert task.golden_negative(record, seed=3) == task.golden_negative(record, seed=3)
  for negative in seeded:
    assert task.reward(record, negative).correct == 0.0


def test_task_negatives_follow_config_slip():
  task = arithmetic.ArithmeticTask()
  record = dict(_record("987+654"), index=7)
  first = reflect_rl.TaskNegatives(task, slip="first", seed=0)
  assert first(record) == task.golden_negative(record)
  random_a = reflect_rl.TaskNegatives(task, slip="random", seed=0)
  assert random_a(record) == random_a(record)  # the same problem keeps its negative
  # Over records and seeds, "random" picks more than the first slip.
  picks = {reflect_rl.TaskNegatives(task, slip="random", seed=s)(record) for s in range(10)}
  assert len(picks) > 1


# ---- the JSONL source ----


def test_jsonl_negatives(tmp_path):
  path = tmp_path / "gnt.jsonl"
  lines = [{"prompt": "Q: 1+9=\n", "negative": "1+9: 1+9+0=0\n#### 0"},
           {"prompt": "Q: 2+2=\n", "negative": "#### 5"},
           {"prompt": "Q: 1+9=\n", "negative": "a second one is ignored"}]
  path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
  source = reflect_rl.JsonlNegatives(path)
  assert len(source) == 2
  assert source({"prompt": "Q: 1+9=\n"}) == "1+9: 1+9+0=0\n#### 0"
  assert source({"prompt": "Q: 2+2=\n"}) == "#### 5"
  assert source({"prompt": "Q: 3+3=\n"}) is None
  config = _config(negatives_path=str(path))
  assert isinstance(reflect_rl.negative_source(config, arithmetic.ArithmeticTask()),
                    reflect_rl.JsonlNegatives)

  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"prompt": "x"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with 'prompt'"):
    reflect_rl.JsonlNegatives(bad)


def test_missing_negatives_file_names_the_key(tmp_path):
  config = _config(negatives_path=str(tmp_path / "nope.jsonl"))
  with pytest.raises(ValueError, match=r"config\.reflect\.negatives_path=.*nope\.jsonl.*no such"):
    reflect_rl.negative_source(config, arithmetic.ArithmeticTask())


def test_task_without_golden_negatives_needs_a_file():
  task = types.SimpleNamespace(name="countdown")
  with pytest.raises(ValueError, match=r"config\.reflect\.negatives_path is empty and task "
                                       r"'countdown' has no golden_negative"):
    reflect_rl.TaskNegatives(task)


def test_long_negative_is_cut_to_its_head_and_end():
  tokenizer = get_tokenizer("char")
  negative = "".join(str(i % 10) for i in range(50))
  cut = reflect_rl.fit_negative(tokenizer, negative, 12, 4)
  assert cut == negative[:4] + negative[-8:]
  assert reflect_rl.fit_negative(tokenizer, "short", 12, 4) == "short"


# ---- the step's prompts ----


@pytest.mark.parametrize("count", [0, 1, 3, 4])
def test_exactly_the_first_k_rows_of_a_group_are_reflective(count):
  n = 4
  records = [_record(e) for e in ("47+38", "12+34", "987+654")]
  task = arithmetic.ArithmeticTask()
  negatives = [task.golden_negative(r) for r in records]
  assert negatives[1] is None and negatives[0] and negatives[2]
  rows = reflect_rl.step_prompts(records, negatives, group_size=n, count=count,
                                 template=TEMPLATE)
  assert rows.group_ids.tolist() == [0] * n + [1] * n + [2] * n
  assert rows.has_negative.tolist() == [True, False, True]
  for g, record in enumerate(records):
    flags = rows.reflective[g * n:(g + 1) * n].tolist()
    k = count if negatives[g] is not None else 0  # no negative: all N rows direct
    assert flags == [True] * k + [False] * (n - k)
    for row in range(g * n, (g + 1) * n):
      expected = (TEMPLATE.format(prompt=record["prompt"], negative=negatives[g])
                  if rows.reflective[row] else record["prompt"])
      assert rows.prompts[row] == expected


def test_schedule_of_the_configs():
  # runlocal: a fixed 5-step transition from p_h = 0.5 with N = 4 (no ties at .5 of a row).
  config = _config()
  assert [reflect_rl.schedule(config, s).count for s in (1, 2, 3, 4, 5)] == [2, 1, 1, 0, 0]
  g = reflect_rl.schedule(config, 1).fraction
  assert g == pytest.approx(0.25 * (1 + np.cos(np.pi / 5)), abs=1e-6)  # N g = 1.81
  # Full config: N = 8, transition = 60 % of 30 steps = 18, then direct only.
  config = _config("")
  counts = [reflect_rl.schedule(config, s).count for s in range(0, 31)]
  assert counts[0] == 4 and counts[18:] == [0] * 13
  assert all(a >= b for a, b in zip(counts, counts[1:]))  # non-increasing
  assert reflect_rl.transition_steps(config) == 18
  # The GRPO baseline of the sweep.
  config = _config("", p_high=0.0)
  assert {reflect_rl.schedule(config, s).count for s in range(31)} == {0}


def test_mixed_group_advantage_is_grpo_over_all_n_rewards():
  config = _config("")
  n = config.group_size
  records = [_record(e) for e in ("47+38", "987+654", "12+34")]
  task = arithmetic.ArithmeticTask()
  rows = reflect_rl.step_prompts(records, [task.golden_negative(r) for r in records],
                                 group_size=n, count=3, template=TEMPLATE)
  rng = np.random.default_rng(0)
  correct = rng.integers(0, 2, size=len(rows.prompts)).astype(np.float32)
  correct[rows.reflective] = 1.0  # reflection helps: the two halves differ
  fmt = np.ones_like(correct)
  objective = policy_objective(config)
  rewards = np.stack([{"correct": correct, "format": fmt}[k] for k in objective.reward_names], 1)
  adv = np.asarray(objective.advantage_fn(
    jnp.asarray(rewards), jnp.asarray(rows.group_ids), num_groups=len(records),
    eps=config.advantage_eps, reward_weights=objective.reward_weights))
  # Reference (Eq. 9): r = Σ_k w_k r_k; per record, mean and Bessel std over all N rows,
  # reflective and direct together.
  weights = np.asarray([config.reward_weights[k] for k in objective.reward_names])
  r = rewards @ weights
  expected = np.zeros_like(r)
  for g in range(len(records)):
    rows_g = rows.group_ids == g
    x = r[rows_g]
    expected[rows_g] = (x - x.mean()) / (x.std(ddof=1) + config.advantage_eps) if x.std() else 0
  np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)
  # Not the same as two groups (reflective rows normalised apart): the test can tell.
  assert np.abs(adv[rows.reflective]).max() > 1e-3


class _Sampler:
  """Records `generate` calls and returns a rollout of the right rows (prompt p: rows p·n…)."""

  def __init__(self):
    self.calls = []

  def generate(self, params, prompts, *, n_samples_per_prompt, **sampling):
    self.calls.append((list(prompts), n_samples_per_prompt))
    rows = len(prompts) * n_samples_per_prompt
    zeros = jnp.zeros((rows, 3), jnp.int32)
    return Rollout(prompt_tokens=zeros, prompt_mask=zeros > 0, completion_tokens=zeros,
                   completion_mask=zeros > 0, logp=jnp.zeros((rows, 3)),
                   finish_reason=jnp.zeros(rows, jnp.int32),
                   group_ids=jnp.repeat(jnp.arange(len(prompts), dtype=jnp.int32),
                                        n_samples_per_prompt))


@pytest.mark.parametrize("count", [2, 0])
def test_rollout_samples_the_rows_and_groups_them_by_record(count):
  """K > 0: one flat call, one sample per row; K = 0: GRPO's call (N samples per prompt).
  Either way the rows of a record form one group."""
  config = _config()
  n = config.group_size
  method = reflect_rl.ReflectRL(config)
  sampler = _Sampler()
  method.runtime = grpo.PolicyRuntime(
    step_fn=None, sampler=sampler, scorer=None,
    evaluator=types.SimpleNamespace(sampler_params=lambda params: (params, 0.0)))
  method.rng = jax.random.key(0)
  records = [_record(e) for e in ("47+38", "12+34")]
  task = arithmetic.ArithmeticTask()
  rows = reflect_rl.step_prompts(records, [task.golden_negative(r) for r in records],
                                 group_size=n, count=count, template=TEMPLATE)
  timings = {}
  rollout = method.rollout(types.SimpleNamespace(params=None), records, rows, 1, timings)
  assert np.asarray(rollout.group_ids).tolist() == [0] * n + [1] * n
  assert set(timings) == {"time/reshard", "time/generate"}
  ((prompts, samples),) = sampler.calls
  if count:
    assert (prompts, samples) == (rows.prompts, 1)
  else:
    assert (prompts, samples) == ([r["prompt"] for r in records], n)


def test_teacher_reflective_rows_spread_over_prompts_with_a_negative():
  group_ids = np.repeat(np.arange(4), 4)
  has_negative = np.array([True, False, True, True])
  for count in range(0, 17):
    rows = reflect_rl.teacher_reflective_rows(group_ids, has_negative, count)
    assert rows.sum() == min(count, 12)  # at most every row of the 3 prompts with one
    assert not rows[group_ids == 1].any()
    per_prompt = [int(rows[group_ids == g].sum()) for g in (0, 2, 3)]
    assert max(per_prompt) - min(per_prompt) <= 1  # spread evenly
    for g in (0, 2, 3):  # a prompt's first rows first
      flags = rows[group_ids == g].tolist()
      assert flags == sorted(flags, reverse=True)


class _Scorer:
  """Records the teacher's prompts; log-probs = the row's prompt length (to trace rows)."""

  def __init__(self, tokenizer):
    self.tokenizer, self.prompts = tokenizer, None

  def prepare(self, prompts):
    self.prompts = list(prompts)
    width = max(len(p) for p in prompts)
    tokens = np.zeros((len(prompts) + 3, width), np.int32)  # + filler rows (batch bucket)
    mask = np.zeros(tokens.shape, bool)
    for i, p in enumerate(prompts):
      mask[i, width - len(p):] = True
    return types.SimpleNamespace(tokens=tokens, mask=mask, num_prompts=len(prompts))

  def score(self, params, *, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
            **kwargs):
    assert prompt_tokens.shape[0] == completion_tokens.shape[0]
    logp = np.broadcast_to(prompt_mask.sum(1, keepdims=True), completion_tokens.shape)
    return types.SimpleNamespace(logp=logp.astype(np.float32))


def test_opd_teacher_scores_k_batch_rows_under_the_reflective_prompt():
  """Eq. 11: the student's tokens, the teacher's prompt x^R for K^batch rows, x^D otherwise."""
  config = _config("runlocal,mode=opd,teacher=/some/teacher")
  n = config.group_size
  method = reflect_rl.ReflectRL(config)
  tokenizer = get_tokenizer("char")
  method.tokenizer, method.scorer = tokenizer, _Scorer(tokenizer)
  method.put, method.teacher = (lambda tree: tree), "teacher params"
  records = [_record(e) for e in ("47+38", "12+34", "987+654")]
  task = arithmetic.ArithmeticTask()
  negatives = [task.golden_negative(r) for r in records]
  rows = reflect_rl.step_prompts(records, negatives, group_size=n, count=0, template=TEMPLATE)
  assert not rows.reflective.any()  # the student samples x^D only
  batch = {"completion_tokens": np.zeros((3 * n, 5), np.int32),
           "completion_mask": np.ones((3 * n, 5), bool)}
  logp, reflective = method.teacher_logp(records, negatives, rows, batch, 5)
  assert reflective.sum() == 5 and not reflective[n:2 * n].any()
  for row, prompt in enumerate(method.scorer.prompts):
    g = rows.group_ids[row]
    expected = (TEMPLATE.format(prompt=records[g]["prompt"], negative=negatives[g])
                if reflective[row] else records[g]["prompt"])
    assert prompt == expected
    assert logp[row, 0] == len(expected)  # each row scored with its own teacher prompt


def test_opd_mode_needs_a_teacher_and_a_known_mode():
  with pytest.raises(ValueError, match=r"config\.reflect\.mode='opd' needs a teacher: set "
                                       r"config\.reflect\.teacher="):
    reflect_rl.ReflectRL(_config("runlocal,mode=opd"))
  with pytest.raises(ValueError, match=r"config\.reflect\.mode='sft': known: rlvr, opd"):
    reflect_rl.ReflectRL(_config(mode="sft"))


def test_reward_split_and_delta_ref():
  correct = np.array([1, 1, 0, 0, 0, 1, 0, np.nan], np.float32)
  reflective = np.array([1, 0, 0, 0, 1, 1, 0, 0], bool)
  groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
  split = reflect_rl.reward_split(correct, reflective, groups)
  assert split["reflect/reward_reflective"] == pytest.approx(2 / 3)
  assert split["reflect/reward_direct"] == pytest.approx(1 / 4)  # the NaN row left out
  # Group 0: 1 − 1/3; group 1: 1/2 − 0.
  assert split["reflect/delta_ref"] == pytest.approx(((1 - 1 / 3) + 0.5) / 2)
  none = reflect_rl.reward_split(correct, np.zeros(8, bool), groups)
  assert np.isnan(none["reflect/reward_reflective"]) and np.isnan(none["reflect/delta_ref"])


def test_state_dict_round_trip(loader_position):
  method = reflect_rl.ReflectRL(_config())
  method.data_iter = loader_position()
  method.data_iter.set_state({"next_index": 5})
  saved = json.loads(json.dumps(method.state_dict()))
  other = reflect_rl.ReflectRL(_config())
  other.data_iter = loader_position()
  other.load_state_dict(saved)
  assert other.data_iter.get_state() == {"next_index": 5}


# ---- config errors, each naming its key ----


def test_unknown_kernel_names_the_key_and_the_known_ones():
  with pytest.raises(ValueError, match=r"config\.reflect\.kernel='cosin': unknown kernel; "
                                       r"known: cosine, linear, step"):
    reflect_rl.ReflectRL(_config(kernel="cosin"))
  for name in losses.REFLECT_KERNELS.names():  # every registered one is accepted
    reflect_rl.ReflectRL(_config(f"runlocal,kernel={name}"))


@pytest.mark.parametrize("reflect, match", [
  (dict(p_high=1.5), r"config\.reflect\.p_high=1\.5 must be in \[0, 1\]"),
  (dict(template="{prompt} only"), r"config\.reflect\.template=.*exactly the fields"),
  (dict(negative_head=200), r"config\.reflect\.negative_head=200"),
  (dict(slip="last"), r"config\.reflect\.slip='last'"),
  (dict(transition_steps=-1), r"config\.reflect\.transition_steps=-1"),
])
def test_other_reflect_errors_name_the_key(reflect, match):
  with pytest.raises(ValueError, match=match):
    reflect_rl.ReflectRL(_config(**reflect))


def test_prompt_len_too_small_fails_at_build_naming_the_key(tmp_path):
  config = _config()
  config.prompt_len = 64
  method = reflect_rl.ReflectRL(config)
  run = types.SimpleNamespace(workdir=tmp_path, train_mesh=None, train_rules=DEFAULT_RULES)
  with pytest.raises(ValueError, match=r"a reflective prompt has \d+ tokens, more than "
                                       r"config\.prompt_len=64; raise config\.prompt_len"):
    method.build_model(run)
  config.prompt_len = 128  # the config's own value fits
  reflect_rl.ReflectRL(config).build_model(run)


def test_every_reflective_prompt_of_the_task_fits_the_config():
  config = _config("")
  tokenizer = get_tokenizer(config.tokenizer)
  task = arithmetic.ArithmeticTask(**config.task_knobs)
  for a in range(100):
    for b in range(100):
      for op in "+-":
        record = _record(f"{a}{op}{b}")
        negative = task.golden_negative(record)
        if negative is not None:
          prompt = reflect_rl.reflective_prompt(config.reflect.template, record["prompt"],
                                                negative)
          reflect_rl.check_prompt_fits(tokenizer, prompt, config.prompt_len)


def test_sweep_is_grpo_against_reflect_rl_over_three_seeds():
  added = []
  load_module(ROOT / "configs" / "reflect_rl.py").sweep(lambda **kw: added.append(kw))
  assert sorted((kw["seed"], kw["reflect.p_high"]) for kw in added) == [
    (s, p) for s in (0, 1, 2) for p in (0.0, 0.5)]
