"""Small local stand-ins for Hugging Face checkpoints, for running the real-model path offline.

Nothing can be downloaded on a machine without network access, yet the path a user runs with
`init_from="hf:Qwen/Qwen3-0.6B"` (Hub resolution, safetensors loading, the checkpoint's own
tokenizer and chat template, export back to `transformers`) should be exercised end to end.
`write_standin_checkpoint` writes a directory shaped like a Qwen3 repository on the Hub:

  config.json, model.safetensors          a reduced-size Qwen3 with random weights (`save_hf`)
  tokenizer.json, tokenizer_config.json   a byte-level BPE trained on a small maths corpus, with
                                          Qwen's special tokens (`<|im_start|>`, `<|im_end|>`,
                                          `<|endoftext|>`, `<think>`, `</think>`)
  chat_template.jinja                     a ChatML template with Qwen3's features: an optional
                                          system turn, the generation prompt, and the
                                          `enable_thinking` switch (False writes an empty
                                          `<think>` block after the generation prompt)
  generation_config.json                  the end-of-turn ids (`<|im_end|>`, `<|endoftext|>`)

`transformers` loads every file of it (`AutoModelForCausalLM`, `AutoTokenizer`), so tests can
compare against it. `write_gsm8k_standin` writes word problems in the layout and columns of the
Hub's `openai/gsm8k` files (`main/{train,test}-00000-of-00001.parquet`, `question`, `answer`
ending in `#### <number>`), and `write_math_standin` problems in the layout and columns of
`DigitalLearningGmbH/MATH-lighteval` (`data/{train,test}-00000-of-00001.parquet`, `problem`,
`level`, `solution` with a `\\boxed{}` answer, `type`). `stage_in_hub_cache` then lays such a
directory out as the Hub client's cache, so that `huggingface_hub.snapshot_download(repo_id)`
finds it with `HF_HUB_OFFLINE=1`.

  path = write_standin_checkpoint(tmp / "qwen3_standin")
  stage_in_hub_cache(path, "Qwen/Qwen3-0.6B", cache_dir=tmp / "hub")
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import save_hf

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
END_OF_TURN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML with Qwen3's switches, written for this project: an optional system turn, user and
# assistant turns, the assistant header when `add_generation_prompt`, and an empty thinking
# block after it when `enable_thinking` is false (Qwen3's way of turning thinking off).
QWEN3_STYLE_TEMPLATE = (
  "{%- for message in messages %}"
  "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
  "{{- raise_exception('unsupported role: ' + message['role']) }}"
  "{%- endif %}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}"
  "{{- '<|im_start|>assistant\\n' }}"
  "{%- if enable_thinking is defined and enable_thinking is false %}"
  "{{- '<think>\\n\\n</think>\\n\\n' }}"
  "{%- endif %}"
  "{%- endif %}"
)


_NAMES = ("Ann", "Bob", "Chen", "Dana", "Eli", "Fay")
_THINGS = ("apples", "books", "coins", "marbles", "pens", "cards")


def _sum_problem(rng: random.Random, high: int) -> tuple[int, int, str, str]:
  """Two addends in [2, high), a name and a thing: one word problem's draws."""
  a, b = rng.randrange(2, high), rng.randrange(2, high)
  return a, b, rng.choice(_NAMES), rng.choice(_THINGS)


def maths_corpus(lines: int = 400, seed: int = 0) -> list[str]:
  """Synthetic word problems, worked solutions and boxed answers (what the BPE is trained on)."""
  rng = random.Random(seed)
  out = []
  for _ in range(lines):
    a, b, who, what = _sum_problem(rng, 200)
    out.append(f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have now?")
    out.append(f"{who} has {a} + {b} = {a + b} {what}.\n#### {a + b}")
    out.append(f"Compute $\\frac{{{a}}}{{{b}}} + {a}$. The answer is $\\boxed{{{a + b}}}$.")
  out.append("Please reason step by step, and put your final answer within \\boxed{}.")
  return out


def gsm8k_rows(count: int, seed: int = 0) -> list[dict[str, str]]:
  """`count` GSM8K-shaped rows: a word problem and a worked solution ending in `#### <n>`."""
  rng = random.Random(seed)
  rows = []
  for _ in range(count):
    a, b, who, what = _sum_problem(rng, 60)
    rows.append({
      "question": f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have?",
      "answer": f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {what}.\n#### {a + b}",
    })
  return rows


def write_gsm8k_standin(directory: str | os.PathLike, *, train: int = 64, test: int = 16,
                        seed: int = 0) -> dict[str, Path]:
  """Writes GSM8K-shaped parquet files as the Hub lays them out; returns split → file."""
  return _write_parquet_splits(directory, "main", gsm8k_rows, train, test, seed)


def math_rows(count: int, seed: int = 0) -> list[dict[str, str]]:
  """`count` MATH-shaped rows: fraction sums whose solutions box the reduced answer."""
  from fractions import Fraction

  rng = random.Random(seed)
  rows = []
  for _ in range(count):
    a, b, c, d = (rng.randrange(1, 10) for _ in range(4))
    total = Fraction(a, b) + Fraction(c, d)
    answer = (str(total.numerator) if total.denominator == 1
              else f"\\frac{{{total.numerator}}}{{{total.denominator}}}")
    rows.append({
      "problem": f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$.",
      "level": f"Level {rng.randrange(1, 6)}",
      "solution": f"Over a common denominator the sum is $\\boxed{{{answer}}}$.",
      "type": "Prealgebra",
    })
  return rows


def _write_parquet_splits(directory, folder, make_rows, train, test, seed) -> dict[str, Path]:
  import pyarrow as pa
  import pyarrow.parquet as pq

  files = {}
  for offset, (split, count) in enumerate((("train", train), ("test", test))):
    target = Path(directory) / folder / f"{split}-00000-of-00001.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(make_rows(count, seed=seed + 1000 * offset)), target)
    files[split] = target
  return files


def write_math_standin(directory: str | os.PathLike, *, train: int = 64, test: int = 16,
                       seed: int = 0) -> dict[str, Path]:
  """Writes MATH-shaped parquet files as `MATH-lighteval` lays them out; returns split → file."""
  return _write_parquet_splits(directory, "data", math_rows, train, test, seed)


def _train_tokenizer(vocab_size: int, seed: int):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(maths_corpus(seed=seed), trainer=trainer)
  return tok


def write_standin_checkpoint(path: str | os.PathLike, *, model: str = "qwen3_0p6b",
                             num_layers: int = 2, embed_dim: int = 64, num_heads: int = 4,
                             num_kv_heads: int = 2, head_dim: int = 16, mlp_dim: int = 128,
                             vocab_size: int = 512, seed: int = 0) -> Path:
  """Writes a Hub-shaped checkpoint directory of a reduced `model` preset; returns its path.

  The architecture is the preset's (family, qk-norm, tied embeddings, RoPE) with the sizes
  given here; the vocabulary is the trained tokenizer's (at most `vocab_size`; the model's
  embedding has exactly that many rows, as `transformers` expects from `config.json`).
  """
  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tok = _train_tokenizer(vocab_size, seed)
  tok.save(str(path / "tokenizer.json"))
  ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
  (path / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": END_OF_TURN,
    "pad_token": PAD_TOKEN,
    "bos_token": None,
    "model_max_length": 4096,
  }, indent=2))
  (path / "chat_template.jinja").write_text(QWEN3_STYLE_TEMPLATE)
  end_ids = [ids[END_OF_TURN], ids[PAD_TOKEN]]
  (path / "generation_config.json").write_text(json.dumps({
    "eos_token_id": end_ids, "pad_token_id": ids[PAD_TOKEN],
    "do_sample": True, "temperature": 0.6, "top_p": 0.95,
  }, indent=2))
  config = get_model_config(
    model, vocab_size=tok.get_vocab_size(), num_layers=num_layers, embed_dim=embed_dim,
    num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, mlp_dim=mlp_dim,
    bos_token_id=None, eos_token_ids=tuple(end_ids), pad_token_id=ids[PAD_TOKEN],
    scan_layers=False)
  save_hf(CausalLM(config, rngs=nnx.Rngs(seed)), path)
  return path


def stage_in_hub_cache(checkpoint: str | os.PathLike, repo_id: str, *,
                       cache_dir: str | os.PathLike, repo_type: str = "model",
                       revision: str = "main") -> Path:
  """Copies `checkpoint`'s files into the Hub client's cache layout as `repo_id`@`revision`.

  The layout is `huggingface_hub`'s (`<type>s--<org>--<name>/refs/<revision>` holding a commit
  hash, `snapshots/<hash>/<files>`), so `snapshot_download(repo_id, cache_dir=cache_dir)` and
  `hf_hub_download` return these files offline. Returns the snapshot directory.
  """
  folder = Path(cache_dir) / f"{repo_type}s--{repo_id.replace('/', '--')}"
  commit = "0" * 40
  snapshot = folder / "snapshots" / commit
  snapshot.mkdir(parents=True, exist_ok=True)
  (folder / "refs").mkdir(exist_ok=True)
  (folder / "refs" / revision).write_text(commit)
  source = Path(checkpoint)
  for item in source.rglob("*"):
    if item.is_file():
      target = snapshot / item.relative_to(source)
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(item, target)
  return snapshot
