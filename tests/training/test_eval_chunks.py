"""`evaluation.generate_in_chunks`: bounded sampler calls give the unchunked greedy texts, one
compiled shape, and prompt-major order with n samples."""

from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import Sampler
from jaxrl_post.tokenizers import CharTokenizer
from jaxrl_post.training.evaluation import generate_in_chunks

PROMPTS = [f"Q: {a} + {a + 3} =\n" for a in range(7)]


def _sampler():
  tokenizer = CharTokenizer()
  model = CausalLM(get_model_config("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
  return Sampler(model, tokenizer, max_prompt_len=16)


def test_chunked_greedy_equals_one_call_and_keeps_order():
  sampler = _sampler()
  whole = generate_in_chunks(sampler, None, PROMPTS, max_new_tokens=6, greedy=True)
  assert len(whole) == 7
  chunked = generate_in_chunks(sampler, None, PROMPTS, rows_per_call=3, max_new_tokens=6,
                               greedy=True)
  assert chunked == whole
  # Each prompt alone gives its own text: the order is the prompts'.
  assert generate_in_chunks(sampler, None, PROMPTS[4:5], max_new_tokens=6, greedy=True) == [
    whole[4]]


def test_chunked_samples_are_prompt_major():
  import jax

  sampler = _sampler()
  texts = generate_in_chunks(sampler, None, PROMPTS, n_samples_per_prompt=4, rows_per_call=8,
                             max_new_tokens=5, temperature=1.0, rng=jax.random.key(0))
  assert len(texts) == 28  # 2 prompts per call, the last call padded and cut
  again = generate_in_chunks(sampler, None, PROMPTS, n_samples_per_prompt=4, rows_per_call=8,
                             max_new_tokens=5, temperature=1.0, rng=jax.random.key(0))
  assert texts == again
