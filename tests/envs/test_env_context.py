"""Context functions (goldens, specs), `play`, and token arrays with action masks."""

import doctest

import numpy as np
import pytest

from jaxrl_post.envs import (
  Segment,
  context,
  drop_reasoning,
  get_env,
  identity,
  make_context,
  play,
  render,
  to_tokens,
  truncate,
  turn_to_tokens,
)
from jaxrl_post.tokenizers import CharTokenizer

TOK = CharTokenizer()
# Tags as single special tokens: token counts differ from character counts.
TAG_TOK = CharTokenizer(extra_special_tokens=("<tool>", "</tool>", "<answer>", "</answer>"))

TRANSCRIPT = (
  Segment("prompt", "Start at 12, then *3.\n"),
  Segment("action", "12*3? <tool>calc(12*3)</tool>"),
  Segment("observation", "\n<obs>36</obs>\n"),
  Segment("action", "hmm"),
  Segment("observation", "\n<obs>error: expected ...</obs>\n"),
)


def test_doctests():
  assert doctest.testmod(context).failed == 0


def test_identity():
  assert identity()(TRANSCRIPT) == TRANSCRIPT
  assert identity().text(TRANSCRIPT) == render(TRANSCRIPT)
  assert identity().spec() == {"name": "identity"}


def test_drop_reasoning_golden():
  assert drop_reasoning()(TRANSCRIPT) == (
    Segment("prompt", "Start at 12, then *3.\n"),
    Segment("action", "<tool>calc(12*3)</tool>"),
    Segment("observation", "\n<obs>36</obs>\n"),
    Segment("action", ""),  # No complete block: nothing of the action is kept.
    Segment("observation", "\n<obs>error: expected ...</obs>\n"),
  )
  answer = [("action", "so it is 36\n<answer>36</answer>")]
  assert drop_reasoning()(answer) == (Segment("action", "<answer>36</answer>"),)


def test_truncate_goldens():
  # Segment lengths in characters (= tokens of TOK): prompt 22, action 29, observation 15,
  # action 3, observation 32.
  last_obs = TRANSCRIPT[-1].text
  assert truncate(35, tokenizer=TOK)(TRANSCRIPT) == (TRANSCRIPT[3], TRANSCRIPT[4])
  assert truncate(34, tokenizer=TOK)(TRANSCRIPT) == (Segment("action", "mm"), TRANSCRIPT[4])
  assert truncate(37, tokenizer=TOK)(TRANSCRIPT) == (
    Segment("observation", ">\n"),  # The last 2 characters of "\n<obs>36</obs>\n".
    TRANSCRIPT[3],
    TRANSCRIPT[4],
  )
  assert truncate(5, tokenizer=TOK)(TRANSCRIPT) == (Segment("observation", "obs>\n"),)
  # keep_prompt: the 22-token prompt, then the newest 18 tokens.
  psi = truncate(40, tokenizer=TOK, keep_prompt=True)
  assert psi(TRANSCRIPT) == (TRANSCRIPT[0], Segment("observation", last_obs[-18:]))
  # A prompt longer than the budget is cut like any other segment.
  psi = truncate(10, tokenizer=TOK, keep_prompt=True)
  assert psi(TRANSCRIPT[:1]) == (Segment("prompt", " then *3.\n"),)
  # A budget that fits everything keeps everything.
  assert truncate(10_000, tokenizer=TOK)(TRANSCRIPT) == TRANSCRIPT


@pytest.mark.parametrize("tokenizer", [TOK, TAG_TOK], ids=["chars", "tag_tokens"])
@pytest.mark.parametrize("keep_prompt", [False, True])
def test_truncate_keeps_a_suffix_within_budget(tokenizer, keep_prompt):
  full = render(TRANSCRIPT)
  total = len(tokenizer.encode(full))
  prompt_len = len(tokenizer.encode(TRANSCRIPT[0].text))
  for max_tokens in range(1, total + 3):
    out = truncate(max_tokens, tokenizer=tokenizer, keep_prompt=keep_prompt)(TRANSCRIPT)
    text = render(out)
    assert len(tokenizer.encode(text)) == min(max_tokens, total)
    if keep_prompt and prompt_len <= max_tokens:
      assert out[0] == TRANSCRIPT[0] and full.endswith(text[len(TRANSCRIPT[0].text) :])
    else:
      assert full.endswith(text)
    # Roles survive: every kept segment is a (suffix of a) transcript segment with its role.
    for segment in out:
      assert any(s.role == segment.role and s.text.endswith(segment.text) for s in TRANSCRIPT)


def test_specs_rebuild_the_same_function():
  for psi in [identity(), drop_reasoning(), truncate(17, tokenizer=TOK, keep_prompt=True)]:
    rebuilt = make_context(psi.spec(), tokenizer=TOK)
    assert rebuilt.spec() == psi.spec() and rebuilt(TRANSCRIPT) == psi(TRANSCRIPT)
  assert truncate(17, tokenizer=TOK).spec() == {
    "name": "truncate",
    "max_tokens": 17,
    "keep_prompt": False,
  }
  assert make_context("drop_reasoning") == drop_reasoning()
  with pytest.raises(KeyError, match="valid names: .*drop_reasoning, identity, truncate"):
    make_context("summarise")
  with pytest.raises(ValueError, match="needs a tokenizer"):
    make_context({"name": "truncate", "max_tokens": 8})
  with pytest.raises(ValueError, match="max_tokens"):
    truncate(0, tokenizer=TOK)
  with pytest.raises(ValueError, match="role"):
    identity()([("user", "hi")])


# ---- play and token arrays ----


def _mixed_trajectory(name, psi, horizon=3):
  env = get_env(name, horizon=horizon, spare_turns=2)
  demo = env.demonstration("train", 5)
  actions = ["let me think " + demo[0], "oops", *demo[1:2], "<tool>nope()</tool>", *demo[2:]]
  return env, play(env, actions, index=5, context=psi)


@pytest.mark.parametrize("name", ["calculator", "kv_lookup"])
@pytest.mark.parametrize(
  "psi",
  [identity(), drop_reasoning(), truncate(60, tokenizer=TOK, keep_prompt=True)],
  ids=["identity", "drop_reasoning", "truncate"],
)
def test_play_records_contexts_and_snapshots(name, psi):
  env, trajectory = _mixed_trajectory(name, psi)
  assert trajectory.done and trajectory.reward == 1.0
  assert trajectory.context_spec == psi.spec()
  assert [turn.index for turn in trajectory.turns] == list(range(len(trajectory.turns)))
  for turn in trajectory.turns:
    assert turn.context == psi(turn.snapshot.segments)
    assert turn.snapshot.turn == turn.index
  # The policy sees exactly the recorded context text.
  seen = []
  actions = iter(trajectory.actions)

  def policy(text):
    seen.append(text)
    return next(actions)

  again = play(env, policy, index=5, context=psi)
  assert seen == [turn.context_text for turn in trajectory.turns]
  assert again == trajectory


def test_play_from_a_snapshot_and_early_stop():
  env, trajectory = _mixed_trajectory("kv_lookup", identity())
  k = 2
  sibling = play(env, trajectory.actions[k:], snapshot=trajectory.turns[k].snapshot)
  assert [t.index for t in sibling.turns] == list(range(k, len(trajectory.turns)))
  assert sibling.turns == trajectory.turns[k:] and sibling.final_state == trajectory.final_state
  partial = play(env, trajectory.actions[:2], index=5)
  assert not partial.done and len(partial.turns) == 2
  with pytest.raises(ValueError, match="exactly one"):
    play(env, [], index=0, snapshot=trajectory.turns[0].snapshot)
  with pytest.raises(TypeError, match="single string"):
    play(env, "<answer>1</answer>", index=0)


def _segment_spans(segments, tokenizer, offset=0):
  spans, pos = [], offset
  for segment in segments:
    n = len(tokenizer.encode(segment.text))
    spans.append((segment.role, pos, pos + n))
    pos += n
  return spans


@pytest.mark.parametrize("name", ["calculator", "kv_lookup"])
@pytest.mark.parametrize("tokenizer", [TOK, TAG_TOK], ids=["chars", "tag_tokens"])
@pytest.mark.parametrize("add_bos", [False, True])
def test_to_tokens_masks_only_actions(name, tokenizer, add_bos):
  _, trajectory = _mixed_trajectory(name, drop_reasoning())
  max_len = 400
  arrays = to_tokens(trajectory, tokenizer, max_len, add_bos=add_bos)
  assert arrays.tokens.shape == arrays.action_mask.shape == arrays.turn_ids.shape == (max_len,)
  assert arrays.tokens.dtype == arrays.turn_ids.dtype == arrays.boundaries.dtype == np.int32
  assert not arrays.truncated
  n = int(arrays.mask.sum())
  assert arrays.mask[:n].all() and not arrays.mask[n:].any()
  assert (arrays.tokens[n:] == tokenizer.pad_id).all()
  body = arrays.tokens[int(add_bos) : n]
  assert tokenizer.decode(body, skip_special=False) == render(trajectory.segments)
  if add_bos:
    assert arrays.tokens[0] == tokenizer.bos_id and not arrays.action_mask[0]
  # Every token of the prompt and of every observation (tool output, errors) is unmasked;
  # every token of action k is masked with turn id k, and its first token is boundary k.
  k = 0
  for role, start, stop in _segment_spans(trajectory.segments, tokenizer, int(add_bos)):
    if role == "action":
      assert arrays.action_mask[start:stop].all() and (arrays.turn_ids[start:stop] == k).all()
      assert arrays.boundaries[k] == start
      k += 1
    else:
      assert not arrays.action_mask[start:stop].any() and (arrays.turn_ids[start:stop] == -1).all()
  assert k == len(trajectory.turns) == len(arrays.boundaries)
  assert not arrays.action_mask[n:].any()
  action_text = tokenizer.decode(arrays.tokens[arrays.action_mask], skip_special=False)
  assert action_text == "".join(trajectory.actions)


def test_to_tokens_cut_at_max_len_and_from_a_snapshot():
  _, trajectory = _mixed_trajectory("calculator", identity())
  full = to_tokens(trajectory, TOK, None)
  width = int(full.boundaries[2]) + 3  # Three tokens of action 2 fit, later turns do not.
  cut = to_tokens(trajectory, TOK, width)
  assert cut.truncated and cut.mask.all()
  assert (cut.tokens == full.tokens[:width]).all()
  assert (cut.action_mask == full.action_mask[:width]).all()
  assert cut.boundaries.tolist() == full.boundaries[:3].tolist() + [-1] * (len(full.boundaries) - 3)
  assert (cut.turn_ids[-3:] == 2).all()
  # A continuation from turn 2 trains turns 2.. only; earlier actions are context.
  env = get_env("calculator", horizon=3, spare_turns=2)
  sibling = play(env, trajectory.actions[2:], snapshot=trajectory.turns[2].snapshot)
  arrays = to_tokens(sibling, TOK, None)
  assert (arrays.tokens == full.tokens).all()
  assert arrays.boundaries.tolist() == full.boundaries[2:].tolist()
  trained = full.turn_ids >= 2
  assert (arrays.action_mask == trained).all()
  assert (arrays.turn_ids == np.where(trained, full.turn_ids, -1)).all()


@pytest.mark.parametrize("tokenizer", [TOK, TAG_TOK], ids=["chars", "tag_tokens"])
def test_turn_to_tokens_trains_only_the_turn(tokenizer):
  _, trajectory = _mixed_trajectory("kv_lookup", truncate(50, tokenizer=tokenizer))
  for turn in trajectory.turns:
    arrays = turn_to_tokens(turn, tokenizer, None)
    context_len = len(tokenizer.encode(turn.context_text))
    action_len = len(tokenizer.encode(turn.action))
    assert len(arrays.tokens) == context_len + action_len
    assert tokenizer.decode(arrays.tokens, skip_special=False) == turn.context_text + turn.action
    assert not arrays.action_mask[:context_len].any() and arrays.action_mask[context_len:].all()
    assert (arrays.turn_ids[context_len:] == turn.index).all()
    assert arrays.boundaries.tolist() == [context_len]
