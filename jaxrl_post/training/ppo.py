"""The PPO phase every RL method shares: normalisers, shuffled mini-batches, the update metrics.

One RL step samples a batch of rollouts, then takes `epochs × mini_batches` optimizer updates
on it (Schulman et al. 2017, arXiv 1707.06347, §5): each epoch is a fresh permutation of the
rows cut into `mini_batches` equal parts, and each part is one update with its own token and
sequence counts (a token-mean loss then averages over that update's tokens). With one epoch
and one mini-batch this is the plain on-policy update of GRPO (arXiv 2402.03300).

    state, updates = ppo_phase(step_fn, state, batch, epochs=2, mini_batches=4, rng=rng)
    metrics = merge_update_metrics(updates)   # one record for the whole phase
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses


def with_normalizers(batch: Mapping[str, Any], mask_key: str = "completion_mask", *,
                     extra_tokens: float = 0.0, extra_sequences: float = 0.0) -> dict[str, Any]:
  """Adds the whole batch's `num_tokens` / `num_sequences` (shared by its micro-batches).

  `mask_key` names the `[rows, time]` mask of the tokens the loss counts. `extra_tokens` /
  `extra_sequences` are counted on top: those of rows left out of `batch` because their loss is
  exactly 0 (see `ppo_phase`), so that leaving them out does not rescale the gradient.
  """
  norm = losses.loss_normalizers(jnp.asarray(batch[mask_key]))
  return dict(batch, num_tokens=norm.num_tokens + extra_tokens,
              num_sequences=norm.num_sequences + extra_sequences)


def trim_completions(batch: Mapping[str, Any], multiple: int) -> dict[str, Any]:
  """Drops the all-padding tail of the completion arrays, keeping a multiple of `multiple`.

  A sampler pads completions to `max_new_tokens`; the update and the scoring
  passes cost the padded width, so cutting it to the longest completion of the
  step (rounded up, so only a few widths ever compile) saves their work.
  `multiple=0` keeps the batch as it is.
  """
  mask = np.asarray(batch["completion_mask"])
  width = mask.shape[1]
  if not multiple:
    return dict(batch)
  longest = int(mask.any(axis=0).nonzero()[0].max(initial=-1)) + 1
  keep = min(width, max(multiple, -(-longest // multiple) * multiple))
  return {k: (v[:, :keep] if k.startswith("completion_") else v) for k, v in batch.items()}


def ppo_mini_batches(batch: Mapping[str, Any], num_mini_batches: int,
                     rng: np.random.Generator, *, mask_key: str = "completion_mask",
                     extra_tokens: float = 0.0, extra_sequences: float = 0.0,
                     ) -> list[dict[str, Any]]:
  """Splits a rollout batch into `num_mini_batches` shuffled row subsets, one optimizer step each.

  Every array in `batch` has the rollout rows on axis 0. Each mini-batch gets
  its own `num_tokens` / `num_sequences` (it is a separate update), so a
  token-mean loss averages over that mini-batch's tokens, as in PPO. Rows keep
  their original order inside a mini-batch. `extra_tokens` / `extra_sequences` (the counts of
  rows left out of `batch`, see `ppo_phase`) are shared equally by the mini-batches: each adds
  1/`num_mini_batches` of them, its expected share had those rows been shuffled in.

  Raises:
    ValueError: naming `config.ppo_mini_batches` when it does not divide the rows.
  """
  rows = len(batch[mask_key])
  if num_mini_batches < 1 or rows % num_mini_batches:
    raise ValueError(f"config.ppo_mini_batches={num_mini_batches} must divide the "
                     f"{rows} rollouts of a step")
  if num_mini_batches == 1:
    # The whole batch, as it is: keys that are not per row (a per-prompt block, a scalar)
    # pass through; shuffling one mini-batch's rows would change nothing.
    return [with_normalizers(dict(batch), mask_key, extra_tokens=extra_tokens,
                             extra_sequences=extra_sequences)]
  order = rng.permutation(rows)
  size = rows // num_mini_batches
  chunks = [np.sort(order[i * size:(i + 1) * size]) for i in range(num_mini_batches)]
  share = dict(extra_tokens=extra_tokens / num_mini_batches,
               extra_sequences=extra_sequences / num_mini_batches)
  return [with_normalizers({k: v[idx] for k, v in batch.items()}, mask_key, **share)
          for idx in chunks]


def ppo_phase(step_fn: Callable, state: Any, batch: Mapping[str, Any], *, epochs: int = 1,
              mini_batches: int = 1, rng: np.random.Generator,
              put: Callable[[Any], Any] | None = None, mask_key: str = "completion_mask",
              extra_tokens: float = 0.0, extra_sequences: float = 0.0,
              ) -> tuple[Any, list[dict[str, Any]]]:
  """`epochs × mini_batches` updates of `step_fn` on one rollout batch.

  Args:
    step_fn: `(state, mini_batch) -> (state, metrics)`, e.g. `make_train_step`'s.
    state: the train state (donated to each update).
    batch: host arrays with the rollout rows on axis 0 (the loss's inputs, old log-probs,
      advantages); `num_tokens` / `num_sequences` are added per mini-batch.
    epochs, mini_batches: the phase's layout (PPO's K epochs and M mini-batches).
    rng: the shuffle; seeded from (seed, step) by callers, so a resumed run takes the same
      updates.
    put: places a mini-batch on devices (`parallel.mesh.put_batch` on the trainer's mesh);
      None leaves it to `jit`.
    mask_key: the mask of the counted tokens.
    extra_tokens, extra_sequences: counted tokens / sequences of rows the caller left out of
      `batch` because their loss and gradient are exactly 0 (RTPO's zero-advantage boundaries
      at β = 0): the normalisers still count them, so the update is the full batch's, not
      the kept rows' rescaled by 1 / (1 − zero-advantage rate). Exact with one mini-batch;
      with M mini-batches each counts 1/M of them.

  Returns:
    The new state and each update's metrics, fetched to the host (`merge_update_metrics`
    turns them into one record).
  """
  updates = []
  for _ in range(epochs):
    for mini_batch in ppo_mini_batches(batch, mini_batches, rng, mask_key=mask_key,
                                       extra_tokens=extra_tokens,
                                       extra_sequences=extra_sequences):
      state, metrics = step_fn(state, mini_batch if put is None else put(mini_batch))
      updates.append(jax.device_get(metrics))
  return state, updates


# Train-step metrics that are running counters, not per-update values.
_LAST = ("nonfinite_streak",)
_SUMMED = ("skipped",)


def merge_update_metrics(updates: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """One record from a phase's updates: the mean of each scalar, except the counters.

  `nonfinite_streak` is carried in the train state, so the last update's value is the current
  one; `skipped` adds up; `num_updates` counts the updates. Non-scalar entries (per-domain
  sums, say) are left to the caller.
  """
  if not updates:
    return {"num_updates": 0.0}
  host = [{k: float(v) for k, v in u.items() if np.ndim(v) == 0} for u in updates]
  merged = {k: float(np.mean([u[k] for u in host])) for k in host[0]}
  merged.update({k: host[-1][k] for k in _LAST if k in host[-1]})
  merged.update({k: float(sum(u[k] for u in host)) for k in _SUMMED if k in host[-1]})
  merged["num_updates"] = float(len(host))
  return merged
