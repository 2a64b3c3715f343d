"""Text generation with a Gemma 3 model: `generate` (prefill, then one cached decode step per new token: greedy decoding
replays the captured step with the argmax on the device, one step queued ahead; sampling reads the logits row),
`choose_token` (argmax or temperature / top-k / top-p sampling in numpy on one row of logits, as HF's logits
processors), `format_chat` (Gemma 3's chat template) and `GenerationResult` (ids and timings)."""
from __future__ import annotations
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence
import numpy as np
from tgrad.helpers import gc_paused
from tgrad.tensor import Tensor
from tgrad.models.gemma3 import CONTEXT_GRANULE, Gemma3

def format_chat(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
  """Gemma 3's chat template (spec section 10) without the leading <bos> (callers add the BOS id). A system
  message becomes a prefix of the first user turn; "assistant" is renamed "model"; contents are stripped."""
  prefix, turns = "", list(messages)
  if turns and turns[0]["role"] == "system":
    prefix, turns = turns[0]["content"] + "\n\n", turns[1:]
  out = []
  for i, message in enumerate(turns):
    if (message["role"] == "user") != (i % 2 == 0):
      raise ValueError(f"conversation roles must alternate user/assistant/..., got {[m['role'] for m in turns]}")
    role = "model" if message["role"] == "assistant" else message["role"]
    out.append(f"<start_of_turn>{role}\n{prefix if i == 0 else ''}{message['content'].strip()}<end_of_turn>\n")
  return "".join(out) + ("<start_of_turn>model\n" if add_generation_prompt else "")

def choose_token(logits: np.ndarray, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 rng: Optional[np.random.Generator] = None) -> int:
  """The next token from one row of logits, on the host: argmax when temperature is 0, else a sample after
  temperature, top-k, then top-p (nucleus) filtering, in that order (as HF's logits processors)."""
  if temperature <= 0: return int(np.argmax(logits))
  scores = logits.astype(np.float64) / temperature
  if 0 < top_k < scores.size: scores[scores < np.partition(scores, -top_k)[-top_k]] = -np.inf
  probs = np.exp(scores - scores.max())
  probs /= probs.sum()
  if top_p < 1.0:
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]      # mass of the tokens ranked above each one
    probs[order[before >= top_p]] = 0.0                  # the top token always survives (before = 0)
    probs /= probs.sum()
  return int((rng or np.random.default_rng()).choice(probs.size, p=probs))

@dataclass
class GenerationResult:
  ids: list[int]                 # generated token ids (the EOS id that stopped generation included)
  prompt_tokens: int
  prefill_seconds: float         # the prompt's forward pass and the first token's choice
  decode_seconds: float          # every later token: one cached forward step each
  step_seconds: list[float] = field(default_factory=list)
  stopped_at_eos: bool = False
  @property
  def decode_tokens(self) -> int: return max(len(self.ids) - 1, 0)
  @property
  def prefill_tokens_per_second(self) -> float:
    return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0
  @property
  def decode_tokens_per_second(self) -> float:
    return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

def generate(model: Gemma3, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: Optional[int] = None, eos_ids: Sequence[int] = (),
             on_token: Optional[Callable[[int], None]] = None, max_context: Optional[int] = None,
             jit: bool = True) -> GenerationResult:
  """Prefill the prompt, then decode one token per cached step until max_new_tokens or an EOS id (max_new_tokens 0:
  nothing runs and no ids come back).
  The cache is sized to the prompt plus max_new_tokens, rounded up to CONTEXT_GRANULE (a cache of the model's last
  size is reused, with the programs captured on it). With `jit` (the default) the prefill and the decode step are
  each captured once by a TinyJit and replayed (the prompt's length and the position are bound Variables: one capture
  serves every length and position; the same ids and logits as without: the same kernels run, without building and
  scheduling the graph again). Python's cyclic garbage collector is paused while the tokens are made (on_token
  included) and restored as it was after."""
  prompt = [int(t) for t in prompt_ids]
  if not prompt: raise ValueError("the prompt has no tokens")
  if max_new_tokens < 0: raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
  bad = [t for t in prompt if not 0 <= t < model.config.vocab_size]
  if bad: raise ValueError(f"prompt ids outside the vocabulary [0, {model.config.vocab_size}): {bad[:10]}")
  if max_new_tokens == 0: return GenerationResult([], len(prompt), 0.0, 0.0)
  needed = len(prompt) + max_new_tokens
  limit = model.config.max_position_embeddings
  if needed > limit:
    raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds {limit} positions")
  model.reset_cache(1, max_context or min(-(-needed // CONTEXT_GRANULE) * CONTEXT_GRANULE, limit))
  # Python's cyclic collector stays paused for the token loop: the loop allocates a few hundred objects a step, and a
  # collection it sets off walks every object alive. With a few models loaded (400,000 objects) a full one took
  # 52-241 ms on the H200 host, in the middle of a 50 ms decode of 128 tokens. Whatever the loop leaves in cycles (a
  # first call compiles and captures) is collected after it.
  with gc_paused():
    rng, eos = np.random.default_rng(seed), set(eos_ids)
    start = time.perf_counter()
    logits = model(Tensor(np.array([prompt], dtype=np.int32), device=model.device), 0, last_only=True, jit=jit)
    token = choose_token(logits.numpy()[0, -1], temperature, top_k, top_p, rng)
    result = GenerationResult([token], len(prompt), time.perf_counter() - start, 0.0)
    if on_token: on_token(token)
    position = len(prompt)
    if jit and temperature <= 0 and token not in eos:   # the argmax on the device, the host one step ahead
      step_start = time.perf_counter()
      for (token,) in model.greedy_tokens([token], max_new_tokens - 1):
        result.step_seconds.append(time.perf_counter() - step_start)
        result.ids.append(token)
        if on_token: on_token(token)
        if token in eos: break
        step_start = time.perf_counter()
    while token not in eos and len(result.ids) < max_new_tokens:
      step_start = time.perf_counter()
      logits = model(Tensor(np.array([[token]], dtype=np.int32), device=model.device), position, last_only=True,
                     jit=jit)
      token = choose_token(logits.numpy()[0, -1], temperature, top_k, top_p, rng)
      result.step_seconds.append(time.perf_counter() - step_start)
      result.ids.append(token)
      position += 1
      if on_token: on_token(token)
    result.decode_seconds = sum(result.step_seconds)
    result.stopped_at_eos = token in eos
  return result
