"""Tokenizers: a character-level one for synthetic tasks and a Hugging Face wrapper.

Both implement the small `Tokenizer` protocol that samplers, tasks and trainers use:
`encode` / `decode` for single texts, `encode_batch` for left-padded prompt batches with a mask,
and the ids of the pad / bos / eos tokens.

* `CharTokenizer` maps each character of a fixed alphabet to one id. It is exact: every id is
  one character or one special token, nothing is normalised, and an unknown character is an
  error rather than a silently dropped token. It suits synthetic verifiable tasks (arithmetic,
  key-value lookup) where the reward depends on exact strings.
* `HFTokenizer` loads a Hugging Face checkpoint's `tokenizer.json` with the `tokenizers`
  library (no `transformers` import at runtime) and renders the checkpoint's Jinja chat
  template the way `transformers` does.

`get_tokenizer(name_or_path)` picks one: `"char"`, a checkpoint directory, or a Hub repository
(`"hf:Qwen/Qwen3-0.6B"`, fetched by `hub.resolve_model_dir`).

Generation stops at `end_ids`: the eos id plus, for a checkpoint, the end-of-turn ids of its
`generation_config.json` (chat models end a turn with e.g. `<|im_end|>` while `eos_token` may
be `<|endoftext|>`, or the other way round).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Printable ASCII (space to tilde) plus newline, so multi-line prompts need no extra setup.
DEFAULT_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"

# The named special tokens `transformers` passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
_SPECIAL_TOKEN_KEYS = (
  "bos_token",
  "eos_token",
  "unk_token",
  "sep_token",
  "pad_token",
  "cls_token",
  "mask_token",
)


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of the codebase may assume about a tokenizer."""

  @property
  def vocab_size(self) -> int: ...

  @property
  def pad_id(self) -> int: ...

  @property
  def bos_id(self) -> int | None: ...

  @property
  def eos_id(self) -> int: ...

  @property
  def end_ids(self) -> tuple[int, ...]: ...

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str: ...

  def token_to_id(self, token: str) -> int: ...

  def encode_batch(
    self,
    texts: Sequence[str],
    *,
    max_len: int | None = None,
    left_pad: bool = True,
    add_bos: bool = False,
    add_eos: bool = False,
  ) -> tuple[np.ndarray, np.ndarray]: ...


def pad_batch(
  seqs: Sequence[Sequence[int]],
  *,
  pad_id: int,
  max_len: int | None = None,
  left_pad: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
  """Pads token sequences into one `[batch, len]` array and its mask.

  Prompts are left-padded by default so that every prompt ends at the last column and
  generation for the whole batch starts at the same position.

  Args:
    seqs: `batch` sequences of token ids.
    pad_id: id written into padded positions.
    max_len: width of the result. `None` means the longest sequence; an int fixes the width,
      so that jitted code sees one shape whatever the batch holds.
    left_pad: pad on the left (prompts) rather than the right (targets).

  Returns:
    `(tokens, mask)`: `int32 [batch, len]` and `bool [batch, len]`, `mask` True on real tokens.

  Raises:
    ValueError: when a sequence is longer than `max_len`.
  """
  lengths = [len(s) for s in seqs]
  if max_len is None:
    width = max(lengths, default=0)
  else:
    if max_len < 0:
      raise ValueError(f"max_len must be >= 0, got {max_len}")
    for i, n in enumerate(lengths):
      if n > max_len:
        raise ValueError(f"prompt {i} has {n} tokens, more than max_len={max_len}")
    width = max_len
  tokens = np.full((len(seqs), width), pad_id, dtype=np.int32)
  mask = np.zeros((len(seqs), width), dtype=np.bool_)
  for i, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
    cols = slice(width - n, width) if left_pad else slice(0, n)
    tokens[i, cols] = seq
    mask[i, cols] = True
  return tokens, mask


class _BatchEncodeMixin:
  """`encode_batch` written once on top of a class's `encode` and `pad_id`."""

  def encode_batch(
    self,
    texts: Sequence[str],
    *,
    max_len: int | None = None,
    left_pad: bool = True,
    add_bos: bool = False,
    add_eos: bool = False,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes and pads a batch of texts; see `pad_batch` for `max_len` and `left_pad`.

    Returns:
      `(tokens, mask)`: `int32 [batch, len]` ids and `bool [batch, len]`, True on real tokens.
    """
    if isinstance(texts, str):
      # A bare string is a sequence of characters; batching it per character is never meant.
      raise TypeError("encode_batch expects a sequence of strings, got a single string")
    seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
    return pad_batch(seqs, pad_id=self.pad_id, max_len=max_len, left_pad=left_pad)


class CharTokenizer(_BatchEncodeMixin):
  """One id per character of a fixed alphabet, plus special tokens.

  Ids: `0` pad, `1` bos, `2` eos, then `extra_special_tokens` in order, then the alphabet in
  order. Special tokens written in the text (e.g. `"<|user|>"`) encode to their single id, as
  added tokens do in Hugging Face tokenizers, so a rendered chat transcript encodes as intended.

  >>> tok = CharTokenizer("0123456789+=")
  >>> tok.encode("1+2=", add_bos=True)
  [1, 4, 13, 5, 14]
  >>> tok.decode([1, 4, 13, 5, 14, 6, 2])
  '1+2=3'
  """

  def __init__(
    self,
    alphabet: str = DEFAULT_ALPHABET,
    *,
    extra_special_tokens: Sequence[str] = (),
    pad_token: str = "<pad>",
    bos_token: str = "<bos>",
    eos_token: str = "<eos>",
  ):
    """Builds the vocabulary.

    Args:
      alphabet: the characters the tokenizer accepts, each once.
      extra_special_tokens: further special tokens (role markers and the like), ids from 3.
      pad_token: text form of id 0.
      bos_token: text form of id 1.
      eos_token: text form of id 2.

    Raises:
      ValueError: on a repeated character or special token, an empty special token, or a
        one-character special token that is also in the alphabet (its id would be ambiguous).
    """
    if isinstance(extra_special_tokens, str):
      raise TypeError("extra_special_tokens must be a sequence of strings, not one string")
    specials = [pad_token, bos_token, eos_token, *extra_special_tokens]
    _check_unique(alphabet, "alphabet character")
    _check_unique(specials, "special token")
    for tok in specials:
      if not tok:
        raise ValueError("special tokens must be non-empty strings")
      if tok in alphabet and len(tok) == 1:
        raise ValueError(f"special token {tok!r} is also a character of the alphabet")
    self._specials = tuple(specials)
    self._alphabet = alphabet
    self._id_to_token = (*specials, *alphabet)
    self._char_to_id = {c: len(specials) + i for i, c in enumerate(alphabet)}
    self._special_to_id = {t: i for i, t in enumerate(specials)}
    # Longest first, so that a special token that is a prefix of another never wins.
    pattern = "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))
    self._special_re = re.compile(pattern)

  @property
  def alphabet(self) -> str:
    return self._alphabet

  @property
  def special_tokens(self) -> tuple[str, ...]:
    """All special tokens, in id order (pad, bos, eos, extras)."""
    return self._specials

  @property
  def vocab_size(self) -> int:
    return len(self._id_to_token)

  @property
  def pad_id(self) -> int:
    return 0

  @property
  def bos_id(self) -> int:
    return 1

  @property
  def eos_id(self) -> int:
    return 2

  @property
  def end_ids(self) -> tuple[int, ...]:
    """The ids that end a completion: the eos alone."""
    return (self.eos_id,)

  def token_to_id(self, token: str) -> int:
    """The id of a special token or of one alphabet character."""
    idx = self._special_to_id.get(token, self._char_to_id.get(token))
    if idx is None:
      raise ValueError(f"{token!r} is neither a special token nor a character of the alphabet")
    return idx

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Maps text to ids.

    Raises:
      ValueError: naming the first character that is not in the alphabet and its position.
    """
    ids = [self.bos_id] if add_bos else []
    pos = 0
    for m in self._special_re.finditer(text):
      self._encode_chars(text, pos, m.start(), ids)
      ids.append(self._special_to_id[m.group()])
      pos = m.end()
    self._encode_chars(text, pos, len(text), ids)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def _encode_chars(self, text: str, start: int, stop: int, out: list[int]) -> None:
    for pos in range(start, stop):
      idx = self._char_to_id.get(text[pos])
      if idx is None:
        raise ValueError(
          f"character {text[pos]!r} at position {pos} is not in the tokenizer's alphabet"
        )
      out.append(idx)

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    """Maps ids back to text; special tokens are dropped unless `skip_special=False`.

    Raises:
      ValueError: naming an id outside `[0, vocab_size)` and its position.
    """
    n_special = len(self._specials)
    pieces = []
    for pos, idx in enumerate(ids):
      idx = int(idx)
      if not 0 <= idx < self.vocab_size:
        raise ValueError(
          f"token id {idx} at position {pos} is outside the vocabulary [0, {self.vocab_size})"
        )
      if skip_special and idx < n_special:
        continue
      pieces.append(self._id_to_token[idx])
    return "".join(pieces)


class HFTokenizer(_BatchEncodeMixin):
  """A Hugging Face `tokenizer.json` tokenizer with the checkpoint's chat template.

  `encode` never adds special tokens on its own (the `tokenizer.json` post-processor is not
  run): a bos or eos appears only when asked for with `add_bos` / `add_eos`, or when the text
  (e.g. a rendered chat template) contains it. That keeps one place deciding about bos and
  matches what `transformers` encodes for `apply_chat_template`.

  `vocab_size` counts the tokenizer's tokens, added tokens included. A model's embedding table
  is often larger (padded to a multiple of 64 or 128); size the model from its own config.
  """

  def __init__(
    self,
    tokenizer: Any,
    *,
    special_tokens: Mapping[str, str | None],
    chat_template: str | None = None,
    source: str = "<in memory>",
    source_dir: str | os.PathLike[str] | None = None,
    extra_end_ids: Sequence[int] = (),
  ):
    """Wraps a loaded tokenizer; most callers want `HFTokenizer.from_dir`.

    Args:
      tokenizer: a `tokenizers.Tokenizer`.
      special_tokens: the named special tokens (`bos_token`, `eos_token`, `pad_token`, ...),
        as strings; `eos_token` is required, `pad_token` defaults to it.
      chat_template: the Jinja chat template, if the checkpoint has one.
      source: where the tokenizer came from, for error messages.
      source_dir: the directory the tokenizer files were read from (`from_dir` sets it).
      extra_end_ids: ids besides the eos that end a completion (`end_ids`), e.g. the
        `eos_token_id` list of `generation_config.json`.

    Raises:
      ValueError: when there is no `eos_token`, a special token is not in the vocabulary, or an
        end id is outside it.
    """
    self._tok = tokenizer
    self._source = source
    self._source_dir = None if source_dir is None else os.fspath(source_dir)
    self._chat_template = chat_template
    self._special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
    if "eos_token" not in self._special_tokens:
      raise ValueError(
        f"tokenizer at {source} has no eos_token: set 'eos_token' in {TOKENIZER_CONFIG_FILE} "
        f"(or {SPECIAL_TOKENS_MAP_FILE}); generation needs it to stop"
      )
    self._eos_id = self.token_to_id(self._special_tokens["eos_token"])
    bos = self._special_tokens.get("bos_token")
    self._bos_id = None if bos is None else self.token_to_id(bos)
    pad = self._special_tokens.get("pad_token")
    self._pad_id = self._eos_id if pad is None else self.token_to_id(pad)
    end_ids = [self._eos_id]
    for idx in extra_end_ids:
      if not 0 <= int(idx) < self.vocab_size:
        raise ValueError(f"end-of-turn id {idx} of the tokenizer at {source} is outside its "
                         f"vocabulary [0, {self.vocab_size})")
      if int(idx) not in end_ids:
        end_ids.append(int(idx))
    self._end_ids = tuple(end_ids)

  @classmethod
  def from_dir(cls, path: str | os.PathLike[str]) -> HFTokenizer:
    """Loads a tokenizer from a Hugging Face checkpoint directory.

    Reads `tokenizer.json` and, when present, `tokenizer_config.json`,
    `special_tokens_map.json`, `chat_template.jinja` and `generation_config.json` (whose
    `eos_token_id`, an int or a list, adds to `end_ids`).

    Special tokens come from `tokenizer_config.json`; `special_tokens_map.json` fills in the
    ones it lacks. The chat template comes from `chat_template.jinja` when that file exists (as
    `transformers` >= 4.50 saves it), else from the config's `chat_template` key.

    Raises:
      FileNotFoundError: when the directory or its `tokenizer.json` is missing.
    """
    import tokenizers  # Deferred: `CharTokenizer` users need not have it installed.

    path = os.fspath(path)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    tokenizer_file = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_file):
      raise FileNotFoundError(
        f"{tokenizer_file} not found: HFTokenizer needs the Hugging Face `tokenizers` file "
        f"{TOKENIZER_FILE} (slow-tokenizer files such as vocab.txt or *.model are not supported)"
      )
    config = _read_json(os.path.join(path, TOKENIZER_CONFIG_FILE))
    special_map = _read_json(os.path.join(path, SPECIAL_TOKENS_MAP_FILE))
    special_tokens = {}
    for key in _SPECIAL_TOKEN_KEYS:
      value = config.get(key, special_map.get(key))
      special_tokens[key] = _token_content(value, key, path)

    chat_template = None
    template_file = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.isfile(template_file):
      with open(template_file, encoding="utf-8") as f:
        chat_template = f.read()
    elif config.get("chat_template") is not None:
      chat_template = _default_template(config["chat_template"], path)

    generation = _read_json(os.path.join(path, GENERATION_CONFIG_FILE))
    return cls(
      tokenizers.Tokenizer.from_file(tokenizer_file),
      special_tokens=special_tokens,
      chat_template=chat_template,
      source=path,
      source_dir=path,
      extra_end_ids=_end_ids(generation.get("eos_token_id"), path),
    )

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def bos_id(self) -> int | None:
    return self._bos_id

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def end_ids(self) -> tuple[int, ...]:
    """The ids that end a completion: the eos, then `generation_config.json`'s `eos_token_id`s.

    A chat checkpoint ends an assistant turn with its end-of-turn token (Qwen: `<|im_end|>`),
    which need not be its `eos_token`; sampling stops at any of these (`Sampler`'s default).
    """
    return self._end_ids

  @property
  def source_dir(self) -> str | None:
    """The directory the tokenizer files were read from; None for one built in memory."""
    return self._source_dir

  @property
  def special_tokens(self) -> dict[str, str]:
    """The named special tokens that are set, e.g. `{"eos_token": "<|im_end|>", ...}`."""
    return dict(self._special_tokens)

  @property
  def chat_template(self) -> str | None:
    return self._chat_template

  def token_to_id(self, token: str) -> int:
    """The id of one token of the vocabulary (e.g. a stop marker such as `<|im_end|>`)."""
    idx = self._tok.token_to_id(token)
    if idx is None:
      raise ValueError(
        f"token {token!r} is not in the vocabulary of the tokenizer at {self._source}"
      )
    return idx

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Maps text to ids, adding bos / eos only when asked.

    Raises:
      ValueError: for `add_bos=True` when the tokenizer has no bos token.
    """
    if add_bos and self._bos_id is None:
      raise ValueError(f"add_bos=True, but the tokenizer at {self._source} has no bos_token")
    ids = self._tok.encode(text, add_special_tokens=False).ids
    if add_bos:
      ids.insert(0, self._bos_id)
    if add_eos:
      ids.append(self._eos_id)
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    """Maps ids back to text; special tokens are dropped unless `skip_special=False`.

    Raises:
      ValueError: naming an id outside `[0, vocab_size)` and its position.
    """
    ids = [int(i) for i in ids]
    vocab_size = self.vocab_size
    for pos, idx in enumerate(ids):
      # `tokenizers` skips unknown ids without a word; a wrong id here is a bug upstream.
      if not 0 <= idx < vocab_size:
        raise ValueError(
          f"token id {idx} at position {pos} is outside the vocabulary [0, {vocab_size})"
        )
    return self._tok.decode(ids, skip_special_tokens=skip_special)

  def apply_chat_template(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    tokenize: bool = False,
    **template_kwargs: Any,
  ) -> str | list[int]:
    """Renders a conversation with the checkpoint's chat template, as `transformers` does.

    The template sees `messages`, `add_generation_prompt`, the named special tokens
    (`bos_token`, `eos_token`, ...) and `template_kwargs` (e.g. `enable_thinking=False` for
    Qwen3), which override special tokens of the same name. Message keys whose value is `None`
    are dropped first, as `transformers` does, since templates test for a key's presence.

    Args:
      messages: dicts with at least `role` and `content`.
      add_generation_prompt: end with the header that opens an assistant turn.
      tokenize: return ids (`encode` of the text, no extra special tokens) instead of text.
      **template_kwargs: further variables for the template.

    Returns:
      The rendered text, or its ids when `tokenize=True`.

    Raises:
      ValueError: when the checkpoint has no chat template, or `messages` is empty.
      jinja2.TemplateError: when the template calls `raise_exception`.
    """
    if self._chat_template is None:
      raise ValueError(
        f"tokenizer at {self._source} has no chat template: neither {CHAT_TEMPLATE_FILE} nor "
        f"the 'chat_template' key of {TOKENIZER_CONFIG_FILE} is present"
      )
    if not messages:
      raise ValueError("cannot apply a chat template to an empty conversation")
    plain = []
    for i, message in enumerate(messages):
      if not isinstance(message, Mapping):
        raise TypeError(f"message {i} must be a dict with 'role' and 'content', got {message!r}")
      plain.append({k: v for k, v in message.items() if v is not None})
    text = _compile_chat_template(self._chat_template).render(
      messages=plain,
      add_generation_prompt=add_generation_prompt,
      **{**self._special_tokens, **template_kwargs},
    )
    return self.encode(text) if tokenize else text


def get_tokenizer(name_or_path: str | os.PathLike[str]) -> Tokenizer:
  """Returns the tokenizer a config names.

  Args:
    name_or_path: `"char"` for a `CharTokenizer` over printable ASCII; a directory holding a
      Hugging Face `tokenizer.json`, or a Hub repository `"hf:<org>/<name>[@<revision>]"`
      (only its configs and tokenizer files are fetched), for an `HFTokenizer`.

  Raises:
    ValueError: for anything else, listing the valid choices; a malformed Hub spec.
    FileNotFoundError: a repository that cannot be fetched, or lacks `tokenizer.json`.
  """
  from jaxrl_post import hub  # Deferred: `hub` reads this module's file names.

  if name_or_path == "char":
    return CharTokenizer()
  if hub.is_hub_spec(name_or_path):
    path = hub.resolve_model_dir(name_or_path, weights=False)
    return HFTokenizer.from_dir(hub.require_tokenizer_files(path, source=name_or_path))
  if os.path.isdir(name_or_path):
    return HFTokenizer.from_dir(name_or_path)
  raise ValueError(
    f"unknown tokenizer {os.fspath(name_or_path)!r}; valid choices: 'char', or the path of an "
    f"existing directory holding {TOKENIZER_FILE}, or a Hub repository as 'hf:<org>/<name>'"
  )


def _check_unique(items: Iterable[str], what: str) -> None:
  seen = set()
  for item in items:
    if item in seen:
      raise ValueError(f"{what} {item!r} appears more than once")
    seen.add(item)


def _read_json(path: str) -> dict[str, Any]:
  """The contents of an optional JSON file; `{}` when it does not exist."""
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _end_ids(value: Any, path: str) -> list[int]:
  """`generation_config.json`'s `eos_token_id`: absent, an int, or a list of ints."""
  if value is None:
    return []
  values = value if isinstance(value, list) else [value]
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
    raise ValueError(f"'eos_token_id' in {os.path.join(path, GENERATION_CONFIG_FILE)} must be "
                     f"an int or a list of ints, got {value!r}")
  return values


def _token_content(value: Any, key: str, path: str) -> str | None:
  """A special token's text; configs store either a string or an AddedToken dict."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, Mapping) and isinstance(value.get("content"), str):
    return value["content"]
  raise ValueError(f"{key} in {path} must be a string or a dict with 'content', got {value!r}")


def _default_template(value: Any, path: str) -> str:
  """The default template of a config's `chat_template`: a string, or a list of named ones."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
    if "default" in named:
      return named["default"]
    raise ValueError(
      f"'chat_template' in {os.path.join(path, TOKENIZER_CONFIG_FILE)} lists templates "
      f"{sorted(map(str, named))} but none named 'default'"
    )
  raise ValueError(f"'chat_template' in {path} must be a string or a list, got {type(value)}")


@functools.lru_cache(maxsize=16)
def _compile_chat_template(template: str) -> Any:
  """Compiles a chat template in the environment `transformers` renders templates in.

  Chat templates from the Hub are untrusted code, hence the immutable sandbox. The other
  settings change the output and so must match `transformers`: block tags do not leave their
  newline or leading indentation behind (`trim_blocks`, `lstrip_blocks`), `tojson` neither
  escapes HTML nor non-ASCII, and `raise_exception` / `strftime_now` are available.
  """
  import jinja2
  import jinja2.ext
  import jinja2.sandbox

  class GenerationTag(jinja2.ext.Extension):
    # `{% generation %}...{% endgeneration %}` marks assistant text for `transformers`' mask
    # of assistant tokens. Parsing it is needed to render such templates at all; the body is
    # rendered unchanged.
    tags = {"generation"}

    def parse(self, parser):
      next(parser.stream)
      return parser.parse_statements(("name:endgeneration",), drop_needle=True)

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
      x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )

  def strftime_now(fmt):
    return datetime.now().strftime(fmt)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True,
    lstrip_blocks=True,
    extensions=[GenerationTag, jinja2.ext.loopcontrols],
  )
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  return env.from_string(template)
