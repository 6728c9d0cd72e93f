"""Legal-token decoding: a token-level finite-state grammar and masked, renormalised log-probs.

PertMind (arXiv 2608.16419, §4) and RecoverFly (arXiv 2608.09467, §5.2; a PROPOSAL there)
decode structured answers whose every position has a small set of legal tokens. A
`TokenGrammar` is a deterministic automaton over token ids:

  allowed     bool[S, V]   token v is legal in state s
  next_state  int32[S, V]  the state after v in s
  start       int32[]      the state before a completion's first token
  accepting   bool[S]      states in which the end-of-sequence ids are legal

Every log-prob under a grammar — the sampler's recorded ones and the trainer's recomputed ones
— is that of the masked, renormalised distribution

  log π̃(y_t) = z_t[y_t] − logsumexp_{v ∈ legal(s_t)} z_t[v],   z_t = logits_t / temperature,
  s_{t+1} = next_state[s_t, y_t],   s_0 = start,

implemented by replacing illegal logits with `MASKED_LOGIT` (finite, so that entropies and
gradients stay finite: exp(MASKED_LOGIT − max) is exactly 0 in float32, so the log-softmax
over all V ids equals the one over the legal ids bit for bit, and an illegal logit gets a zero
gradient). The mask is applied before the temperature and before top-k / top-p.

Illegal transitions lead to a free sink state (the last state: everything legal, stays
there), so that scoring an out-of-grammar completion is defined (its illegal token gets log-prob
≈ MASKED_LOGIT) and the grammar constrains nothing after it. The sampler never reaches it.

The trainer never forms a `[batch, time, vocab]` mask: `completion_states` recomputes the
states per position with a scan over time (`[batch, time]` ints), and `logits_transform` gathers
`allowed[states]` one logit chunk at a time inside `scoring.score_hidden`.

Builders (`GRAMMARS`): `"slots"` (`from_slots`): a sequence of slots of alternative strings,
e.g. `[["[pw1 "], ["Up", "Down", "No"], ["] <ans> "], ["Up", "Down", "No"]]`, each alternative
tokenised on its own and merged into a trie; the slots' tries are chained and determinised
(subset construction), so alternatives that share prefixes, or one that is a prefix of
another, are handled. The end-of-sequence ids are legal exactly in the accepting states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

# The logit illegal tokens get: finite (no NaN in entropies or gradients), and
# exp(MASKED_LOGIT / temperature − max) == 0 in float32 for any temperature ≤ 1e8.
MASKED_LOGIT = -1e30


class TokenGrammar(NamedTuple):
  """A deterministic token automaton (a pytree of arrays; module docstring).

  The last state is the free sink (`sink`): all tokens legal, every token stays there.
  """

  allowed: jax.Array  # bool[S, V]
  next_state: jax.Array  # int32[S, V]
  start: jax.Array  # int32[]
  accepting: jax.Array  # bool[S]

  @property
  def num_states(self) -> int:
    return self.allowed.shape[0]

  @property
  def vocab_size(self) -> int:
    return self.allowed.shape[1]

  @property
  def sink(self) -> int:
    return self.allowed.shape[0] - 1


GRAMMARS: Registry = Registry("grammar")


def mask_logits(logits: jax.Array, allowed: jax.Array) -> jax.Array:
  """`logits` `[..., V]` with the entries where `allowed` `[..., V]` is False set to
  `MASKED_LOGIT` (the legal ones unchanged, so their gradient passes, the others' is 0)."""
  return jnp.where(allowed, logits, jnp.asarray(MASKED_LOGIT, logits.dtype))


def masked_log_probs(logits: jax.Array, allowed: jax.Array, temperature=1.0) -> jax.Array:
  """`log π̃(v) = z[v] − logsumexp_{u legal} z[u]` for legal v, `z = logits / temperature`.

  Args:
    logits: `[..., V]`; allowed: `bool[..., V]` (broadcastable).

  Returns:
    float32 `[..., V]`; illegal entries ≈ MASKED_LOGIT / temperature (probability exactly 0).

  Example:
    >>> lp = masked_log_probs(jnp.log(jnp.array([0.5, 0.3, 0.2])), jnp.array([1, 0, 1], bool))
    >>> [round(float(x), 4) for x in jnp.exp(lp)]
    [0.7143, 0.0, 0.2857]
  """
  masked = mask_logits(logits.astype(jnp.float32), allowed)
  return jax.nn.log_softmax(masked / temperature, axis=-1)


def step_states(grammar: TokenGrammar, states: jax.Array, tokens: jax.Array) -> jax.Array:
  """`next_state[states, tokens]`, elementwise over any shape."""
  return grammar.next_state[states, tokens]


def allowed_at(grammar: TokenGrammar, states: jax.Array) -> jax.Array:
  """`allowed[states]`: `bool[..., V]` for `int32[...]` states."""
  return grammar.allowed[states]


def completion_states(grammar: TokenGrammar, completion_tokens: jax.Array,
                      completion_mask: jax.Array | None = None) -> jax.Array:
  """`int32[batch, time]`: the state before each completion token, `s_0 = start`,
  `s_{t+1} = next_state[s_t, y_t]` (a scan over time; the state holds on masked positions).

  `[batch, time]` integers only: the `[batch, time, V]` mask is never formed (see
  `logits_transform`).
  """
  tokens = jnp.asarray(completion_tokens, jnp.int32)
  mask = jnp.ones(tokens.shape, bool) if completion_mask is None else completion_mask

  def body(state, x):
    token, keep = x
    return jnp.where(keep, grammar.next_state[state, token], state), state

  start = jnp.broadcast_to(grammar.start, tokens.shape[:1]).astype(jnp.int32)
  _, states = jax.lax.scan(body, start, (tokens.T, jnp.asarray(mask, bool).T))
  return states.T


def logits_transform(grammar: TokenGrammar, key: str = "grammar_state"):
  """A `scoring.LogitsTransform` `(logits [b, c, V], mask [b, c], states [b, c]) -> logits`:
  illegal logits of each position's state masked, one chunk at a time (`score_hidden`).

  `states` is the chunk's `int32[b, c]` states, or a mapping holding them under `key` (a
  policy loss's `transform_keys` inputs, `training.objectives.make_policy_loss`)."""
  def transform(logits, mask, states):
    del mask
    if isinstance(states, Mapping):
      states = states[key]
    return mask_logits(logits, grammar.allowed[states])
  return transform


# ---- building ----


def check_grammar(grammar: TokenGrammar, state_names: Sequence[str] | None = None) -> None:
  """Raises a ValueError naming the state (and its slot, from `state_names`) when a state
  reachable from `start` through legal tokens has no legal token; also on bad shapes."""
  allowed = np.asarray(grammar.allowed, bool)
  nxt = np.asarray(grammar.next_state)
  if allowed.ndim != 2 or nxt.shape != allowed.shape:
    raise ValueError(f"grammar: allowed {allowed.shape} and next_state {nxt.shape} must be "
                     "equal [states, vocab] shapes")
  num_states = allowed.shape[0]
  if nxt.min() < 0 or nxt.max() >= num_states:
    raise ValueError(f"grammar: next_state has states outside [0, {num_states})")
  if np.asarray(grammar.accepting).shape != (num_states,):
    raise ValueError(f"grammar: accepting must have shape ({num_states},)")
  start = int(grammar.start)
  if not 0 <= start < num_states:
    raise ValueError(f"grammar: start state {start} outside [0, {num_states})")
  seen, todo = {start}, [start]
  while todo:
    s = todo.pop()
    legal = np.flatnonzero(allowed[s])
    if not legal.size:
      where = f" ({state_names[s]})" if state_names is not None else ""
      raise ValueError(f"grammar: reachable state {s}{where} allows no token; every "
                       "reachable state needs a legal token (an empty slot, or an accepting "
                       "state without end ids?)")
    for t in set(nxt[s, legal].tolist()) - seen:
      seen.add(t)
      todo.append(t)


@GRAMMARS.register("slots")
def from_slots(tokenizer, slots: Sequence[Sequence[str]], *, eos_ids: Sequence[int] | None = None
               ) -> TokenGrammar:
  """The grammar of `slots[0] slots[1] … slots[-1] EOS`, each slot one of its alternatives.

  Each alternative is `tokenizer.encode`d on its own (its canonical tokens; with a subword
  tokenizer the concatenation's own encoding may differ, which is fine for constrained
  decoding: the grammar defines the legal sequences) and added to its slot's trie; the tries
  are chained with ε-edges (end of an alternative → next slot's root) and determinised by
  subset construction. EOS (`eos_ids`, default the tokenizer's `end_ids`) is legal in the
  accepting states (after a full last slot) and leads to the sink.

  Raises:
    ValueError: naming the slot (`slots[i]`) with no alternatives or a non-string one, or
      a reachable state with no legal token (`check_grammar`).
  """
  vocab = int(tokenizer.vocab_size)
  eos = list(tokenizer.end_ids if eos_ids is None else eos_ids)
  if not slots:
    raise ValueError("slots: a grammar needs at least one slot")
  # NFA nodes: (slot, trie node); trie node 0 is the slot's root. Node ids are global.
  edges: list[dict[int, set[int]]] = []  # node -> token -> nodes
  eps: list[set[int]] = []
  names: list[str] = []
  roots, finals = [], []
  for i, slot in enumerate(slots):
    if isinstance(slot, str) or not len(slot):
      raise ValueError(f"slots[{i}]={slot!r}: a slot is a non-empty list of alternatives")
    root = len(edges)
    edges.append({}), eps.append(set()), names.append(f"slot {i} start")
    roots.append(root)
    ends = []
    for alt in slot:
      if not isinstance(alt, str):
        raise ValueError(f"slots[{i}] alternative {alt!r} is not a string")
      node = root
      for k, token in enumerate(tokenizer.encode(alt)):
        children = edges[node].setdefault(int(token), set())
        child = next(iter(children), None)  # a trie: one child per token
        if child is None:
          child = len(edges)
          edges.append({}), eps.append(set()), names.append(f"slot {i} after {alt[:k + 1]!r}")
          children.add(child)
        node = child
      ends.append(node)
    finals.append(ends)
  for i, ends in enumerate(finals[:-1]):
    for node in ends:
      eps[node].add(roots[i + 1])
  accept_nodes = set(finals[-1])

  def closure(nodes):
    out, todo = set(nodes), list(nodes)
    while todo:
      for m in eps[todo.pop()] - out:
        out.add(m)
        todo.append(m)
    return frozenset(out)

  start = closure({roots[0]})
  index, order, rows = {start: 0}, [start], []
  while len(rows) < len(order):
    subset = order[len(rows)]
    moves: dict[int, set[int]] = {}
    for node in subset:
      for token, targets in edges[node].items():
        moves.setdefault(token, set()).update(targets)
    row = {}
    for token, targets in moves.items():
      target = closure(targets)
      if target not in index:
        index[target] = len(order)
        order.append(target)
      row[token] = index[target]
    rows.append(row)
  num_states = len(order) + 1
  sink = num_states - 1
  allowed = np.zeros((num_states, vocab), bool)
  nxt = np.full((num_states, vocab), sink, np.int32)
  accepting = np.zeros(num_states, bool)
  state_names = []
  for s, (subset, row) in enumerate(zip(order, rows)):
    for token, target in row.items():
      if not 0 <= token < vocab:
        raise ValueError(f"slots: token id {token} outside the vocabulary [0, {vocab})")
      allowed[s, token] = True
      nxt[s, token] = target
    if subset & accept_nodes:
      accepting[s] = True
      allowed[s, eos] = True
    state_names.append(" | ".join(sorted(names[n] for n in subset)))
  allowed[sink] = True
  state_names.append("sink")
  grammar = TokenGrammar(jnp.asarray(allowed), jnp.asarray(nxt), jnp.asarray(0, jnp.int32),
                         jnp.asarray(accepting))
  check_grammar(grammar, state_names)
  return grammar


def accepts(grammar: TokenGrammar, tokens: Sequence[int], eos_ids: Sequence[int]) -> bool:
  """Host-side: whether `tokens` is a legal completion that ends with one of `eos_ids` in an
  accepting state (the parse check of a sampled completion)."""
  allowed = np.asarray(grammar.allowed)
  nxt = np.asarray(grammar.next_state)
  accepting = np.asarray(grammar.accepting)
  state = int(grammar.start)
  for token in tokens:
    token = int(token)
    if not allowed[state, token] or state == grammar.sink:
      return False
    if token in eos_ids:
      return bool(accepting[state])
    state = int(nxt[state, token])
  return False
