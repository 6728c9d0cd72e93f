"""Tests for jaxrl_post.tokenizers.

The Hugging Face half trains a tiny byte-level BPE tokenizer on synthetic text, saves it as a
checkpoint directory and compares against `transformers` loading the same directory.
"""

import json
import random

import jinja2
import numpy as np
import pytest

from jaxrl_post import tokenizers as tk

# ---------------------------------------------------------------------------------------------
# CharTokenizer
# ---------------------------------------------------------------------------------------------


def test_char_ids_follow_the_documented_layout():
  tok = tk.CharTokenizer("ab", extra_special_tokens=["<|user|>"])
  # pad, bos, eos, the extra marker, then 'a', 'b'.
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.vocab_size == 6
  assert tok.token_to_id("<|user|>") == 3
  assert tok.encode("ba", add_bos=True, add_eos=True) == [1, 5, 4, 2]
  assert isinstance(tok, tk.Tokenizer)


@pytest.mark.parametrize("text", ["", "12+345=357", "key: v1\nkey2: {x}~", " \n "])
def test_char_round_trip(text):
  tok = tk.CharTokenizer()
  ids = tok.encode(text, add_bos=True, add_eos=True)
  assert len(ids) == len(text) + 2
  assert tok.decode(ids) == text
  assert tok.decode(ids, skip_special=False) == "<bos>" + text + "<eos>"


def test_char_round_trip_every_default_character():
  tok = tk.CharTokenizer()
  text = tk.DEFAULT_ALPHABET
  assert tok.encode(text) == list(range(3, 3 + len(text)))
  assert tok.decode(tok.encode(text)) == text


def test_char_special_tokens_in_text_encode_to_one_id():
  tok = tk.CharTokenizer("abc:", extra_special_tokens=["<|user|>", "<|user|>!"])
  user, user_bang = tok.token_to_id("<|user|>"), tok.token_to_id("<|user|>!")
  # The longer marker wins where both match; text around markers is encoded per character.
  ids = tok.encode("<|user|>!a<|user|>b")
  assert ids == [user_bang, tok.token_to_id("a"), user, tok.token_to_id("b")]
  assert tok.decode(ids) == "ab"
  assert tok.decode(ids, skip_special=False) == "<|user|>!a<|user|>b"
  assert tok.encode("<eos>") == [tok.eos_id]


def test_char_decode_accepts_numpy():
  tok = tk.CharTokenizer("0123456789")
  tokens, _ = tok.encode_batch(["12", "3"])
  assert tok.decode(tokens[1]) == "3"


def test_char_unknown_character_names_it_and_its_position():
  tok = tk.CharTokenizer("abc", extra_special_tokens=["<x>"])
  # Position 5 counts characters of the text, markers included.
  with pytest.raises(ValueError, match=r"character 'é' at position 5 is not in"):
    tok.encode("ab<x>é")


def test_char_bad_ids_and_bad_vocabularies():
  tok = tk.CharTokenizer("ab")
  with pytest.raises(ValueError, match=r"token id 5 at position 1 is outside the vocabulary"):
    tok.decode([3, 5])
  with pytest.raises(ValueError, match="token id -1"):
    tok.decode([-1])
  with pytest.raises(ValueError, match="'z' is neither a special token nor a character"):
    tok.token_to_id("z")
  with pytest.raises(ValueError, match="alphabet character 'a' appears more than once"):
    tk.CharTokenizer("aba")
  with pytest.raises(ValueError, match="special token '<eos>' appears more than once"):
    tk.CharTokenizer("ab", extra_special_tokens=["<eos>"])
  with pytest.raises(ValueError, match="special token 'a' is also a character"):
    tk.CharTokenizer("ab", extra_special_tokens=["a"])
  with pytest.raises(ValueError, match="non-empty"):
    tk.CharTokenizer("ab", extra_special_tokens=[""])


# ---------------------------------------------------------------------------------------------
# Batch padding (shared by both tokenizers)
# ---------------------------------------------------------------------------------------------


def test_encode_batch_left_pads_prompts():
  tok = tk.CharTokenizer("0123456789")
  tokens, mask = tok.encode_batch(["12", "3", ""], add_bos=True)
  # '1' -> 4, '2' -> 5, '3' -> 6; bos 1; pad 0 on the left.
  np.testing.assert_array_equal(tokens, [[1, 4, 5], [0, 1, 6], [0, 0, 1]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 1, 1], [0, 0, 1]])
  assert tokens.dtype == np.int32 and mask.dtype == np.bool_


def test_encode_batch_right_pad_and_fixed_width():
  tok = tk.CharTokenizer("0123456789")
  tokens, mask = tok.encode_batch(["12", "3"], max_len=4, left_pad=False, add_eos=True)
  np.testing.assert_array_equal(tokens, [[4, 5, 2, 0], [6, 2, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 0, 0]])


def test_encode_batch_empty_batch():
  tokens, mask = tk.CharTokenizer().encode_batch([], max_len=3)
  assert tokens.shape == mask.shape == (0, 3)
  assert tk.CharTokenizer().encode_batch([])[0].shape == (0, 0)


def test_encode_batch_errors():
  tok = tk.CharTokenizer("0123456789")
  with pytest.raises(ValueError, match=r"prompt 1 has 5 tokens, more than max_len=4"):
    tok.encode_batch(["1", "12345", "1"], max_len=4)
  with pytest.raises(ValueError, match="max_len must be >= 0"):
    tok.encode_batch(["1"], max_len=-1)
  with pytest.raises(TypeError, match="single string"):
    tok.encode_batch("123")


def test_pad_batch_directly():
  tokens, mask = tk.pad_batch([[7], [8, 9]], pad_id=-1)
  np.testing.assert_array_equal(tokens, [[-1, 7], [8, 9]])
  np.testing.assert_array_equal(mask, [[0, 1], [1, 1]])


# ---------------------------------------------------------------------------------------------
# HFTokenizer against transformers
# ---------------------------------------------------------------------------------------------

# A Qwen2.5-style ChatML template. It is written with plain `{% %}` blocks and indentation on
# purpose, so that it only renders right with trim_blocks + lstrip_blocks; it also uses
# `tojson`, `raise_exception`, `bos_token`, a `{% generation %}` block and a loop control.
CHATML_TEMPLATE = """{{ bos_token -}}
{% if messages[0]['role'] == 'system' %}
  {% set system = messages[0]['content'] %}
  {% set rest = messages[1:] %}
{% else %}
  {% set system = 'You are a helpful assistant.' %}
  {% set rest = messages %}
{% endif %}
<|im_start|>system
{{ system }}<|im_end|>
{% for message in rest %}
  {% if message['role'] == 'skip' %}
    {% continue %}
  {% endif %}
  {% if message['role'] not in ['user', 'assistant'] %}
    {{ raise_exception('Unsupported role: ' + message['role']) }}
  {% endif %}
<|im_start|>{{ message['role'] }}
  {% if message['role'] == 'assistant' %}
    {% generation %}
{{ message['content'] }}<|im_end|>
    {% endgeneration %}
  {% else %}
{{ message.content }}{% if message.meta %} {{ message.meta | tojson }}{% endif %}<|im_end|>
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

SPECIALS = ["<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"]

MESSAGES = [
  {"role": "system", "content": "Answer with a number."},
  {"role": "user", "content": "What is 12 + 30?", "meta": {"lang": "en", "x": "<b> & ü"}},
  {"role": "skip", "content": "ignored"},
  {"role": "assistant", "content": "42", "tool_calls": None},
  {"role": "user", "content": "  And 7 * 6?\n"},
]


def _corpus(n_lines=300):
  rng = random.Random(0)
  words = ["key", "value", "lookup", "answer", "sum", "the", "is", "what", "and", "ünï"]
  lines = []
  for _ in range(n_lines):
    a, b = rng.randrange(1000), rng.randrange(1000)
    lines.append(f"{rng.choice(words)} {a} + {b} = {a + b}; {' '.join(rng.sample(words, 4))}")
  return lines


def _save_checkpoint(path, config, tokenizer):
  path.mkdir(exist_ok=True)
  tokenizer.save(str(path / "tokenizer.json"))
  if config is not None:
    (path / "tokenizer_config.json").write_text(json.dumps(config))
  return path


@pytest.fixture(scope="module")
def bpe():
  """A byte-level BPE tokenizer trained on synthetic text (takes a few milliseconds)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=SPECIALS,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(_corpus(), trainer=trainer)
  return tok


@pytest.fixture()
def ckpt(tmp_path, bpe):
  config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    # Special tokens in both forms configs use: plain strings and AddedToken dicts.
    "bos_token": "<|bos|>",
    "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True},
    "pad_token": "<|endoftext|>",
    "chat_template": CHATML_TEMPLATE,
  }
  return _save_checkpoint(tmp_path / "ckpt", config, bpe)


@pytest.fixture()
def hf_ref(ckpt):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(str(ckpt))


def test_hf_special_ids(ckpt, bpe):
  tok = tk.HFTokenizer.from_dir(ckpt)
  assert tok.eos_id == bpe.token_to_id("<|im_end|>")
  assert tok.bos_id == bpe.token_to_id("<|bos|>")
  assert tok.pad_id == bpe.token_to_id("<|endoftext|>")
  assert tok.vocab_size == bpe.get_vocab_size()
  assert isinstance(tok, tk.Tokenizer)


@pytest.mark.parametrize(
  "text", ["", "lookup 12 + 30 = 42", "  ünï\n\tnew words zzz ☃", "<|im_start|>user\nhi<|im_end|>"]
)
def test_hf_round_trip_and_ids_match_transformers(ckpt, hf_ref, text):
  tok = tk.HFTokenizer.from_dir(ckpt)
  ids = tok.encode(text)
  assert ids == hf_ref.encode(text, add_special_tokens=False)
  assert tok.decode(ids, skip_special=False) == text
  assert tok.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
  assert tok.encode(text, add_bos=True, add_eos=True) == [tok.bos_id, *ids, tok.eos_id]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_hf_chat_template_matches_transformers(ckpt, hf_ref, add_generation_prompt):
  tok = tk.HFTokenizer.from_dir(ckpt)
  text = tok.apply_chat_template(MESSAGES, add_generation_prompt=add_generation_prompt)
  ref_text = hf_ref.apply_chat_template(
    MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt
  )
  assert text == ref_text
  # Spot checks that the comparison is not vacuous: whitespace control, tojson, generation.
  assert text.startswith("<|bos|><|im_start|>system\nAnswer with a number.<|im_end|>\n")
  assert 'What is 12 + 30? {"lang": "en", "x": "<b> & ü"}<|im_end|>\n' in text
  assert "<|im_start|>assistant\n42<|im_end|>\n" in text
  assert "ignored" not in text
  assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt

  ids = tok.apply_chat_template(
    MESSAGES, add_generation_prompt=add_generation_prompt, tokenize=True
  )
  ref_ids = hf_ref.apply_chat_template(
    MESSAGES, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
  )
  assert ids == list(ref_ids)
  assert tok.decode(ids, skip_special=False) == text


def test_hf_chat_template_raise_exception_and_kwargs(ckpt, hf_ref):
  tok = tk.HFTokenizer.from_dir(ckpt)
  bad = [{"role": "tool", "content": "x"}]
  with pytest.raises(jinja2.TemplateError, match="Unsupported role: tool"):
    tok.apply_chat_template(bad)
  with pytest.raises(jinja2.TemplateError, match="Unsupported role: tool"):
    hf_ref.apply_chat_template(bad, tokenize=False)
  # Template variables override special tokens of the same name, as in transformers.
  msgs = [{"role": "user", "content": "hi"}]
  text = tok.apply_chat_template(msgs, bos_token="")
  assert text == hf_ref.apply_chat_template(msgs, tokenize=False, bos_token="")
  assert text.startswith("<|im_start|>system")
  with pytest.raises(ValueError, match="empty conversation"):
    tok.apply_chat_template([])


def test_hf_template_file_and_named_templates(tmp_path, bpe):
  # transformers >= 4.50 saves the template as chat_template.jinja; it wins over the config.
  ckpt = _save_checkpoint(
    tmp_path / "jinja", {"eos_token": "<|im_end|>", "chat_template": "from config"}, bpe
  )
  (ckpt / "chat_template.jinja").write_text("{{ messages[0]['content'] }}{{ eos_token }}")
  tok = tk.HFTokenizer.from_dir(ckpt)
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi<|im_end|>"

  # Older configs list named templates; the one named "default" is used.
  named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
  config = {"eos_token": "<|im_end|>", "chat_template": named}
  ckpt = _save_checkpoint(tmp_path / "named", config, bpe)
  tok = tk.HFTokenizer.from_dir(ckpt)
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "plain"


def test_hf_special_tokens_map_and_pad_fallback(tmp_path, bpe):
  # No pad_token anywhere: pad falls back to eos. eos comes from special_tokens_map.json.
  ckpt = _save_checkpoint(tmp_path / "map", {"bos_token": None}, bpe)
  (ckpt / "special_tokens_map.json").write_text(
    json.dumps({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|bos|>"})
  )
  tok = tk.HFTokenizer.from_dir(ckpt)
  assert tok.eos_id == tok.pad_id == bpe.token_to_id("<|endoftext|>")
  assert tok.bos_id is None  # The config's explicit null wins over the map.
  with pytest.raises(ValueError, match="add_bos=True, but .* has no bos_token"):
    tok.encode("a", add_bos=True)
  tokens, mask = tok.encode_batch(["lookup", "the sum is"], max_len=8)
  assert tokens.shape == (2, 8)
  assert (tokens[~mask] == tok.pad_id).all()
  assert tok.decode(tokens[0][mask[0]]) == "lookup"


def test_hf_errors(tmp_path, bpe):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tk.HFTokenizer.from_dir(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match=r"empty/tokenizer\.json not found"):
    tk.HFTokenizer.from_dir(tmp_path / "empty")

  ckpt = _save_checkpoint(tmp_path / "no_config", None, bpe)
  with pytest.raises(ValueError, match=r"no eos_token: set 'eos_token' in tokenizer_config\.json"):
    tk.HFTokenizer.from_dir(ckpt)

  ckpt = _save_checkpoint(tmp_path / "no_template", {"eos_token": "<|im_end|>"}, bpe)
  tok = tk.HFTokenizer.from_dir(ckpt)
  with pytest.raises(ValueError, match=r"no chat template: .*'chat_template' key of tokenizer_c"):
    tok.apply_chat_template([{"role": "user", "content": "hi"}])
  n = len(tok.encode("lookup 12 + 30 = 42"))
  with pytest.raises(ValueError, match=f"prompt 1 has {n} tokens, more than max_len=2"):
    tok.encode_batch(["12", "lookup 12 + 30 = 42"], max_len=2)
  with pytest.raises(ValueError, match=r"token id 400 at position 0 is outside"):
    tok.decode([tok.vocab_size])

  ckpt = _save_checkpoint(tmp_path / "unknown_eos", {"eos_token": "</s>"}, bpe)
  with pytest.raises(ValueError, match=r"token '</s>' is not in the vocabulary"):
    tk.HFTokenizer.from_dir(ckpt)


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def test_get_tokenizer(ckpt):
  assert isinstance(tk.get_tokenizer("char"), tk.CharTokenizer)
  assert isinstance(tk.get_tokenizer(ckpt), tk.HFTokenizer)
  assert isinstance(tk.get_tokenizer(str(ckpt)), tk.HFTokenizer)
  with pytest.raises(ValueError, match=r"unknown tokenizer 'bpe'; valid choices: 'char', or"):
    tk.get_tokenizer("bpe")
