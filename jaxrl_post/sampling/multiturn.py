"""Turn-structured rollouts through the `Sampler`, turn / flat training batches, consistency.

RTPO (arXiv 2608.18682, §2.3) samples turn k of an episode from `c_k = ψ(S_k)`, a context function
of the transcript so far, and trains on exactly that context. This module plays many episodes at
once, one `Sampler.generate` call per turn for all episodes still running:

  policy = SamplerPolicy(sampler, params, max_turn_tokens=40, temperature=1.0)
  starts = [env.initial_state(i) for i in indices]    # or turn snapshots S_k to fork siblings
  trajs = rollout(env, starts, policy, tokenizer=tok, context=psi, max_context_len=256, rng=key)
  batch = turn_batch([t for tr in trajs for t in tr.turns], adv, pad_id=0, ...)   # (c_k, a_k)
  flat = flat_batch(trajs, adv, tokenizer=tok, ...)   # prompt | a_0 | o_0 | a_1 | ... per episode
  consistency(train_logp, batch.rollout_logp, batch.loss_mask).ratio

Each turn: render c_k with ψ, encode it segment by segment (as `envs.context.to_tokens` does) and
cut it to its last `max_context_len` tokens, generate one action per running episode until a stop
string (`envs.STOP_STRINGS`: `</tool>`, `</answer>`), eos or `max_turn_tokens`, and step the
environment with the pure `Env.transition`. The context ids fed to the sampler, the generated
ids and their rollout-time log-probs are recorded, so training scores the very same token
sequences: with the recorded context, training-time and rollout-time log-probs agree up to float
noise and the consistency ratio is 1. The flat view instead re-reads the whole transcript,
which differs from the rollout contexts whenever ψ is not the identity — the context mismatch
that RTPO's paper measures with this ratio.

Stop strings end a turn on the host side (the first token whose decoded prefix contains one). A
stop string that is a single token of the tokenizer is also passed to the sampler as a stop id,
so decoding ends there instead of running to `max_turn_tokens`: `build_tokenizer("char_tools")`
is the character tokenizer with `</tool>` and `</answer>` as single tokens.

Observations are never trained: in every batch `loss_mask` is True only on generated action
tokens; observation tokens are attended to (`completion_mask`) in the flat view but carry no loss.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import tokenizers as tokenizers_lib
from jaxrl_post.envs import STOP_STRINGS, Env, EnvState, Segment, Trajectory, Turn
from jaxrl_post.envs.context import ContextFn, play
from jaxrl_post.parallel import multihost
from jaxrl_post.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_NAMES, FINISH_STOP
from jaxrl_post.sampling.sampler import Sampler
from jaxrl_post.tokenizers import Tokenizer

# ---- tokenizers and stop strings ----


def build_tokenizer(name: str) -> Tokenizer:
  """`"char_tools"`: the character tokenizer with each stop string as one special token.

  One token per stop string lets the sampler stop a turn on device. Any other name goes to
  `tokenizers.get_tokenizer` (`"char"` or a Hugging Face checkpoint directory).
  """
  if name == "char_tools":
    return tokenizers_lib.CharTokenizer(extra_special_tokens=STOP_STRINGS)
  return tokenizers_lib.get_tokenizer(name)


def stop_token_ids(tokenizer: Tokenizer, stop_strings: Sequence[str] = STOP_STRINGS) -> list[int]:
  """Ids of the stop strings that encode to a single token (the others are cut on the host)."""
  ids = []
  for text in stop_strings:
    encoded = tokenizer.encode(text)
    if len(encoded) == 1:
      ids.append(int(encoded[0]))
  return ids


def stop_cut(ids: Sequence[int], tokenizer: Tokenizer, stop_strings: Sequence[str]) -> int | None:
  """How many of `ids` to keep: up to the token that completes the first stop string, or None.

  >>> tok = tokenizers_lib.CharTokenizer()
  >>> stop_cut(tok.encode("<tool>f(x)</tool> more"), tok, ("</tool>",))
  17
  """
  # Prefix decodes are quadratic in the turn length, which is a few dozen tokens.
  for n in range(1, len(ids) + 1):
    text = tokenizer.decode(ids[:n], skip_special=False)
    if any(stop in text for stop in stop_strings):
      return n
  return None


def action_text(ids: Sequence[int], tokenizer: Tokenizer) -> str:
  """The action text of generated ids: a final eos is dropped, special tokens are kept as text."""
  ids = list(ids)
  if ids and ids[-1] == tokenizer.eos_id:
    ids = ids[:-1]
  return tokenizer.decode(ids, skip_special=False)


def encode_context(
  segments: Sequence[Segment], tokenizer: Tokenizer, max_len: int, *, add_bos: bool = False
) -> np.ndarray:
  """`int32 [n]` ids of a context, encoded segment by segment, cut to its last `max_len` ids."""
  ids = [tokenizer.bos_id] if add_bos else []
  for segment in segments:
    ids += tokenizer.encode(segment.text)
  return np.asarray(ids[-max_len:], np.int32)


# ---- policies ----


class Generation(NamedTuple):
  """One generated turn.

  Attributes:
    ids: `int32 [n]` generated ids up to the turn's end (stop token or eos included).
    logp: `float32 [n]` their log-probabilities at rollout time.
    finish: one of `sampling.FINISH_EOS`, `FINISH_STOP` (a stop string), `FINISH_LENGTH`.
  """

  ids: np.ndarray
  logp: np.ndarray
  finish: int


class TurnPolicy(Protocol):
  """Generates one turn per context: `policy(contexts, rng) -> [Generation]`, in order."""

  def __call__(self, contexts: Sequence[np.ndarray], rng: jax.Array) -> list[Generation]: ...


@dataclasses.dataclass
class SamplerPolicy:
  """A `TurnPolicy` that samples with `Sampler.generate` at fixed parameters.

  Attributes:
    sampler: the sampler (with a tokenizer).
    params: model parameters (`nnx.state(model)` or a train state's `params`), in the sampler's
      layout when it has a mesh (`parallel.reshard.reshard_state`).
    max_turn_tokens: the per-turn generation budget.
    temperature, top_k, top_p, greedy: decoding settings (log-probs are at `temperature`).
    stop_strings: strings that end a turn.
  """

  sampler: Sampler
  params: Any
  max_turn_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  stop_strings: tuple[str, ...] = STOP_STRINGS

  def __post_init__(self):
    if self.sampler.tokenizer is None:
      raise ValueError("SamplerPolicy needs a Sampler built with a tokenizer")
    self._stop_ids = stop_token_ids(self.sampler.tokenizer, self.stop_strings)

  def __call__(self, contexts: Sequence[np.ndarray], rng: jax.Array) -> list[Generation]:
    out = self.sampler.generate(
      self.params,
      [np.asarray(c).tolist() for c in contexts],
      max_new_tokens=self.max_turn_tokens,
      temperature=self.temperature,
      top_k=self.top_k,
      top_p=self.top_p,
      greedy=self.greedy,
      stop_tokens=self._stop_ids,
      rng=rng,
    )
    # Whole on every process (the sampler's mesh may span several): each process then steps the
    # same environments the same way, and the batches it builds are the same global values.
    tokens, mask, logp, finish = multihost.to_host(
      (out.completion_tokens, out.completion_mask, out.logp, out.finish_reason)
    )
    generations = []
    for row in range(len(contexts)):
      n = int(mask[row].sum())
      reason = int(finish[row])
      if reason != FINISH_STOP:
        # The sampler stops only at single-token stop strings; others are found here.
        cut = stop_cut(tokens[row, :n].tolist(), self.sampler.tokenizer, self.stop_strings)
        if cut is not None:
          n, reason = cut, FINISH_STOP
      generations.append(
        Generation(tokens[row, :n].astype(np.int32), logp[row, :n].astype(np.float32), reason)
      )
    return generations


# ---- rollouts ----


@dataclasses.dataclass(frozen=True)
class SampledTurn:
  """One generated turn: the env's record of it plus the exact token sequences.

  Attributes:
    turn: the `envs.Turn` (index k, context c_k as segments, action text, observation, reward,
      done, info, and the snapshot S_k to fork siblings from).
    context_ids: `int32 [n_c]` the context as fed to the sampler (after the `max_context_len`
      cut): training reuses it verbatim.
    action_ids: `int32 [n_a]` the generated ids.
    logp: `float32 [n_a]` their rollout-time log-probs.
    finish: how the turn ended (`sampling.FINISH_*`).
    context_cut: whether the context was longer than `max_context_len` and lost its start.
  """

  turn: Turn
  context_ids: np.ndarray
  action_ids: np.ndarray
  logp: np.ndarray
  finish: int
  context_cut: bool = False

  @property
  def index(self) -> int:
    return self.turn.index

  @property
  def snapshot(self) -> EnvState:
    return self.turn.snapshot


@dataclasses.dataclass(frozen=True)
class SampledTrajectory:
  """An episode, or its continuation from a snapshot, as played by `rollout`.

  Attributes:
    turns: the generated turns in order (`turns[0].index` is k when started from S_k).
    final_state: the env state after the last turn.
    context_spec: the spec of ψ (`envs.make_context` rebuilds it).
  """

  turns: tuple[SampledTurn, ...]
  final_state: EnvState
  context_spec: dict[str, Any]

  @property
  def reward(self) -> float:
    """The return of the turns played: the terminal reward R (rewards are sparse)."""
    return float(sum(t.turn.reward for t in self.turns))

  @property
  def success(self) -> bool:
    return self.final_state.done and self.reward >= 1.0

  @property
  def num_generated_tokens(self) -> int:
    return int(sum(len(t.action_ids) for t in self.turns))

  def trajectory(self) -> Trajectory:
    """The `envs.Trajectory` view (texts only)."""
    return Trajectory(tuple(t.turn for t in self.turns), self.final_state, self.context_spec)


def rollout(
  env: Env,
  starts: Sequence[EnvState],
  policy: TurnPolicy | Callable[[Sequence[np.ndarray], jax.Array], list[Generation]],
  *,
  tokenizer: Tokenizer,
  context: ContextFn,
  max_context_len: int,
  rng: jax.Array,
  add_bos: bool = False,
  max_turns: int | None = None,
) -> list[SampledTrajectory]:
  """Plays every start state to the end of its episode, one batched policy call per turn.

  Turn t of the loop renders c = ψ(S) for each running episode, calls `policy` once on all of
  them with key `fold_in(rng, t)`, and steps each env state with `env.transition` (pure: the
  start states, e.g. a trunk's snapshots, are never modified). A tool that raises or runs past
  the env's time limit becomes an `error: ...` observation of that episode only.

  Args:
    env: the environment (only its knobs and pure `transition` are used).
    starts: `EnvState`s to play from: `env.initial_state(i)` or a turn's snapshot S_k.
    policy: a `TurnPolicy`, e.g. `SamplerPolicy`.
    tokenizer: encodes contexts and decodes actions.
    context: ψ.
    max_context_len: contexts keep their last this many tokens.
    rng: PRNG key.
    add_bos: start every context with the bos token.
    max_turns: stop after this many turns per start even if not done (default: the episode's
      own limit).

  Returns:
    One `SampledTrajectory` per start, in order.
  """
  states = list(starts)
  turns: list[list[SampledTurn]] = [[] for _ in states]
  for t in itertools.count():
    active = [
      i
      for i, state in enumerate(states)
      if not state.done and (max_turns is None or len(turns[i]) < max_turns)
    ]
    if not active:
      break
    contexts = [context(states[i].segments) for i in active]
    full = [encode_context(c, tokenizer, 1 << 30, add_bos=add_bos) for c in contexts]
    ids = [x[-max_context_len:] for x in full]
    generations = policy(ids, jax.random.fold_in(rng, t))
    if len(generations) != len(active):
      raise ValueError(f"the policy returned {len(generations)} turns for {len(active)} contexts")
    for i, segments, full_ids, context_ids, gen in zip(
      active, contexts, full, ids, generations, strict=True
    ):
      action = action_text(gen.ids, tokenizer)
      new_state, result = env.transition(states[i], action)
      record = Turn(
        index=states[i].turn,
        context=segments,
        action=action,
        observation=result.observation,
        reward=result.reward,
        done=result.done,
        info=result.info,
        snapshot=states[i],
      )
      turns[i].append(
        SampledTurn(
          record,
          context_ids,
          np.asarray(gen.ids, np.int32),
          np.asarray(gen.logp, np.float32),
          int(gen.finish),
          len(full_ids) > len(context_ids),
        )
      )
      states[i] = new_state
  spec = context.spec()
  return [SampledTrajectory(tuple(ts), s, spec) for ts, s in zip(turns, states, strict=True)]


def demonstration_turns(
  env: Env,
  indices: Sequence[int],
  *,
  tokenizer: Tokenizer,
  context: ContextFn,
  max_context_len: int,
  split: str = "train",
  add_bos: bool = False,
) -> list[SampledTurn]:
  """The turns of the env's demonstrations under ψ, as `SampledTurn`s (log-probs 0), for SFT.

  The contexts are exactly those a rollout would show the model at the same states, so SFT
  teaches the policy on the inputs it will see.
  """
  out = []
  for index in indices:
    trajectory = play(env, env.demonstration(split, index), index=index, split=split,
                      context=context)
    for turn in trajectory.turns:
      full = encode_context(turn.context, tokenizer, 1 << 30, add_bos=add_bos)
      ids = np.asarray(tokenizer.encode(turn.action), np.int32)
      out.append(
        SampledTurn(
          turn,
          full[-max_context_len:],
          ids,
          np.zeros(len(ids), np.float32),
          FINISH_STOP,
          len(full) > max_context_len,
        )
      )
  return out


def rollout_stats(trajectories: Sequence[SampledTrajectory]) -> dict[str, float]:
  """Success, return, turns, tool calls, errors, finish reasons and generated tokens."""
  if not trajectories:
    return {}
  turns = [t for traj in trajectories for t in traj.turns]
  finish = np.array([t.finish for t in turns]) if turns else np.zeros(0, int)
  stats = {
    "success": float(np.mean([traj.success for traj in trajectories])),
    "return": float(np.mean([traj.reward for traj in trajectories])),
    "turns": float(np.mean([len(traj.turns) for traj in trajectories])),
    "tool_calls": float(np.mean([traj.final_state.num_tool_calls for traj in trajectories])),
    "errors": float(np.mean([traj.final_state.num_errors for traj in trajectories])),
    # Episodes cut off at the env's turn limit without an answer.
    "truncated": float(np.mean([bool(traj.turns) and traj.turns[-1].turn.info["truncated"]
                                for traj in trajectories])),
    "generated_tokens": float(sum(traj.num_generated_tokens for traj in trajectories)),
    "context_cut": float(np.mean([t.context_cut for t in turns])) if turns else 0.0,
  }
  for code, name in enumerate(FINISH_NAMES):
    stats[f"finish_{name}"] = float(np.mean(finish == code)) if turns else 0.0
  return stats


# ---- training batches ----


class TurnBatch(NamedTuple):
  """(context, action) rows for training, numpy arrays; padding rows have an empty loss mask.

  Attributes:
    prompt_tokens: `int32 [N, Lc]` contexts, left-padded (one pad token is real on padding
      rows, so every row attends to something).
    prompt_mask: `bool [N, Lc]`.
    completion_tokens: `int32 [N, La]` right-padded: one action (turn view) or the rest of the
      transcript, actions and observations (flat view).
    completion_mask: `bool [N, La]`, True on real completion tokens (attended to).
    loss_mask: `bool [N, La]`, True exactly on generated action tokens being trained.
    turn_ids: `int32 [N, La]` the turn index k on action tokens, −1 elsewhere.
    turn: `int32 [N]` the trained turn of a turn-view row (−1 in the flat view and on padding).
    rollout_logp: `float32 [N, La]` the sampler's log-probs on action tokens, 0 elsewhere.
    adv: `float32 [N]` advantages.
    weight: `float32 [N]` trajectory weights ω (1 unless off-policy continuation).
    num_rows: real rows (the first `num_rows`); the rest is padding.
  """

  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  completion_tokens: np.ndarray
  completion_mask: np.ndarray
  loss_mask: np.ndarray
  turn_ids: np.ndarray
  turn: np.ndarray
  rollout_logp: np.ndarray
  adv: np.ndarray
  weight: np.ndarray
  num_rows: int

  def take(self, rows: np.ndarray) -> TurnBatch:
    """The batch restricted to real rows `rows` (no padding)."""
    arrays = {k: v[rows] for k, v in self._asdict().items() if k != "num_rows"}
    return TurnBatch(**arrays, num_rows=len(rows))

  def arrays(self) -> dict[str, np.ndarray]:
    return {k: v for k, v in self._asdict().items() if k != "num_rows"}


def _empty_batch(rows: int, context_len: int, completion_len: int, pad_id: int) -> dict:
  prompt_mask = np.zeros((rows, context_len), bool)
  prompt_mask[:, -1] = True  # a real (pad) token on padding rows: attention is never empty
  return dict(
    prompt_tokens=np.full((rows, context_len), pad_id, np.int32),
    prompt_mask=prompt_mask,
    completion_tokens=np.full((rows, completion_len), pad_id, np.int32),
    completion_mask=np.zeros((rows, completion_len), bool),
    loss_mask=np.zeros((rows, completion_len), bool),
    turn_ids=np.full((rows, completion_len), -1, np.int32),
    turn=np.full(rows, -1, np.int32),
    rollout_logp=np.zeros((rows, completion_len), np.float32),
    adv=np.zeros(rows, np.float32),
    weight=np.ones(rows, np.float32),
  )


def _check_rows(n: int, rows: int | None) -> int:
  rows = n if rows is None else rows
  if rows < n:
    raise ValueError(f"{n} rows do not fit in a batch of {rows}")
  return rows


def turn_batch(
  turns: Sequence[SampledTurn],
  adv: Sequence[float] | np.ndarray,
  *,
  pad_id: int,
  context_len: int,
  action_len: int,
  rows: int | None = None,
  weight: Sequence[float] | np.ndarray | None = None,
) -> TurnBatch:
  """Rows `c_k | a_k`, one per turn, from the recorded context and action ids.

  Args:
    turns: the turns to train.
    adv: `[len(turns)]` advantage of each turn.
    pad_id: the tokenizer's pad id.
    context_len: width of the context columns (≥ the longest recorded context).
    action_len: width of the action columns (≥ the longest action).
    rows: pad the batch to this many rows (default: `len(turns)`).
    weight: optional `[len(turns)]` trajectory weights.

  Raises:
    ValueError: when a context or action is wider than its columns.
  """
  rows = _check_rows(len(turns), rows)
  out = _empty_batch(rows, context_len, action_len, pad_id)
  for i, t in enumerate(turns):
    c, a = t.context_ids, t.action_ids
    if len(c) > context_len or len(a) > action_len:
      raise ValueError(f"turn {i}: context {len(c)} / action {len(a)} tokens exceed the batch "
                       f"widths {context_len} / {action_len}")
    out["prompt_tokens"][i, context_len - len(c):] = c
    out["prompt_mask"][i] = False
    out["prompt_mask"][i, context_len - len(c):] = True
    out["completion_tokens"][i, :len(a)] = a
    out["completion_mask"][i, :len(a)] = True
    out["loss_mask"][i, :len(a)] = True
    out["turn_ids"][i, :len(a)] = t.index
    out["turn"][i] = t.index
    out["rollout_logp"][i, :len(a)] = t.logp
  out["adv"][: len(turns)] = np.asarray(adv, np.float32)
  if weight is not None:
    out["weight"][: len(turns)] = np.asarray(weight, np.float32)
  return TurnBatch(**out, num_rows=len(turns))


def flat_batch(
  trajectories: Sequence[SampledTrajectory],
  adv: Sequence[float] | np.ndarray,
  *,
  tokenizer: Tokenizer,
  prompt_len: int,
  completion_len: int,
  rows: int | None = None,
  add_bos: bool = False,
) -> tuple[TurnBatch, int]:
  """Rows `history | a_k | o_k | a_{k+1} | ...`, one per trajectory: the flattened view.

  The prompt is the transcript before the trajectory's first turn (the task prompt for an
  episode played from the start), encoded segment by segment; then each turn's generated ids
  (trained, `turn_ids` = k) and its observation's ids (attended, never trained). This is what
  flattened multi-turn GRPO trains on: the full history, whatever context ψ the rollout used.

  Returns:
    `(batch, num_cut)`: the batch and how many rows were longer than `completion_len` (cut at
    the end) or had a prompt longer than `prompt_len` (cut at the start).
  """
  rows = _check_rows(len(trajectories), rows)
  out = _empty_batch(rows, prompt_len, completion_len, tokenizer.pad_id)
  num_cut = 0
  for i, traj in enumerate(trajectories):
    if not traj.turns:
      continue
    history = traj.turns[0].snapshot.segments
    prompt = encode_context(history, tokenizer, 1 << 30, add_bos=add_bos)
    cut = len(prompt) > prompt_len
    prompt = prompt[-prompt_len:]
    ids, trained, turn_ids, logp = [], [], [], []
    for t in traj.turns:
      obs = tokenizer.encode(t.turn.observation)
      ids += [*t.action_ids.tolist(), *obs]
      trained += [True] * len(t.action_ids) + [False] * len(obs)
      turn_ids += [t.index] * len(t.action_ids) + [-1] * len(obs)
      logp += [*t.logp.tolist(), *[0.0] * len(obs)]
    cut |= len(ids) > completion_len
    num_cut += cut
    n = min(len(ids), completion_len)
    out["prompt_tokens"][i, prompt_len - len(prompt):] = prompt
    out["prompt_mask"][i] = False
    out["prompt_mask"][i, prompt_len - len(prompt):] = True
    out["completion_tokens"][i, :n] = ids[:n]
    out["completion_mask"][i, :n] = True
    out["loss_mask"][i, :n] = trained[:n]
    out["turn_ids"][i, :n] = turn_ids[:n]
    out["rollout_logp"][i, :n] = logp[:n]
  out["adv"][: len(trajectories)] = np.asarray(adv, np.float32)
  return TurnBatch(**out, num_rows=len(trajectories)), num_cut


# ---- the consistency metric ----


class Consistency(NamedTuple):
  """Agreement of training-time and rollout-time log-probs over action tokens (float32 scalars).

  Attributes:
    ratio: the geometric-mean probability ratio exp(mean_t(logp_train − logp_rollout)); 1 when
      the two agree (RTPO paper, "log-prob ratio").
    abs_diff_mean: mean |logp_train − logp_rollout|.
    abs_diff_max: max |logp_train − logp_rollout|.
    kl: mean of exp(δ) − 1 − δ, δ = logp_train − logp_rollout (k3 estimate of
      KL(rollout ‖ train)).
  """

  ratio: jax.Array
  abs_diff_mean: jax.Array
  abs_diff_max: jax.Array
  kl: jax.Array


@jax.jit
def consistency(train_logp: jax.Array, rollout_logp: jax.Array, mask: jax.Array) -> Consistency:
  """The RTPO consistency metric between training-time and rollout-time token log-probs.

    ratio = exp( Σ_{i,t} m_{i,t} (logp_train − logp_rollout) / Σ_{i,t} m_{i,t} )

  the geometric mean over action tokens of π_train(a_t | ·) / π_rollout(a_t | ·). It is 1 when
  training recomputes log-probs on the contexts the rollout used, and drifts from 1 when it
  conditions on something else (the flattened full history under a truncating ψ).

  Args:
    train_logp: `[N, T]` log-probs recomputed by the trainer.
    rollout_logp: `[N, T]` log-probs recorded by the sampler.
    mask: `[N, T]` action tokens.

  Returns:
    A `Consistency` (ratio 1 and zeros when the mask is empty).

  Examples:
    >>> import jax.numpy as jnp
    >>> c = consistency(jnp.log(jnp.array([[0.5, 0.2]])), jnp.log(jnp.array([[0.25, 0.2]])),
    ...                 jnp.ones((1, 2)))
    >>> round(float(c.ratio), 4)  # sqrt(2 · 1)
    1.4142

  References:
    Li et al., RTPO: Reverse-Turn Policy Optimization, arXiv 2608.18682, §5 (stability metrics).
  """
  valid = jnp.asarray(mask) > 0
  delta = jnp.where(valid, jnp.asarray(train_logp, jnp.float32) - rollout_logp, 0.0)
  n = jnp.maximum(jnp.sum(valid), 1)
  return Consistency(
    ratio=jnp.exp(jnp.sum(delta) / n),
    abs_diff_mean=jnp.sum(jnp.abs(delta)) / n,
    abs_diff_max=jnp.max(jnp.abs(delta)),
    kl=jnp.sum(jnp.where(valid, jnp.expm1(delta) - delta, 0.0)) / n,
  )


__all__ = [
  "FINISH_EOS",
  "FINISH_LENGTH",
  "FINISH_STOP",
  "Consistency",
  "Generation",
  "SampledTrajectory",
  "SampledTurn",
  "SamplerPolicy",
  "TurnBatch",
  "TurnPolicy",
  "action_text",
  "build_tokenizer",
  "consistency",
  "demonstration_turns",
  "encode_context",
  "flat_batch",
  "rollout",
  "rollout_stats",
  "stop_cut",
  "stop_token_ids",
  "turn_batch",
]
