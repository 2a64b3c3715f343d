"""Gemma's SentencePiece tokenizer, built from a GGUF file's `tokenizer.ggml.*` metadata, and Gemma 3's chat template.

Input: the metadata as a plain dict (`tokenizer.ggml.tokens`, `.scores`, `.token_type`, the special ids and the
add_bos / add_eos / add_space_prefix flags), from any GGUF reader. Output: `GGUFTokenizer`, whose `encode(text)` gives
ids equal to Hugging Face's tokenizer for the same file and whose `decode(ids)` gives text; `apply_chat_template`
renders a conversation as Gemma 3's prompt text. Encoding runs in the `tokenizers` library (a BPE model whose merges
are derived here from the piece list), so it is fast; the rules it follows are described on `GGUFTokenizer`.
"""
from __future__ import annotations
from enum import IntEnum
from typing import Any, Mapping, Sequence
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

METADATA_PREFIX = "tokenizer.ggml."
SENTENCEPIECE_MODEL = "llama"     # what llama.cpp writes under tokenizer.ggml.model for a SentencePiece vocabulary
SPACE_MARK = "\u2581"             # SentencePiece's visible space "▁": spaces in text and in pieces are spelled with it
END_OF_TURN = "<end_of_turn>"     # Gemma's end of a chat turn: a stop token next to EOS
START_OF_TURN = "<start_of_turn>"
START_OF_IMAGE = "<start_of_image>"
BOS_TEXT = "<bos>"                # how the chat template writes the BOS token

class TokenType(IntEnum):
  """llama.cpp's token types (`tokenizer.ggml.token_type`), the same numbering as SentencePiece's piece types + 1."""
  NORMAL = 1
  UNKNOWN = 2
  CONTROL = 3
  USER_DEFINED = 4
  UNUSED = 5
  BYTE = 6

class GGUFTokenizer:
  """SentencePiece BPE over the GGUF piece list, as Hugging Face builds it from the same file:

  - Text: every space becomes "▁" (no dummy prefix unless `add_space_prefix`); pieces made only of spaces are stored
    with real spaces in Gemma files, so they are respelled with "▁" to be reachable.
  - Merges: repeatedly join the adjacent pair whose joined piece comes first in the file. For normal pieces the file
    order is the score order (Gemma's scores are minus the rank, strictly decreasing); it also puts the user-defined
    space runs (score -1000 in the file) ahead of everything, as HF does. Among the splits of one piece the one with
    the longest left part ranks first.
  - Characters left without a piece become their UTF-8 bytes `<0xNN>` (byte fallback); never `<unk>` in practice.
  - Control pieces (`<bos>`, `<start_of_turn>`, `<unused7>`, ...) and user-defined pieces (`\\n\\n`, tab runs,
    `<start_of_image>`) found in the text are kept whole, longest first, before any merging. Control pieces are
    "special": `decode(..., skip_special_tokens=True)` drops them; user-defined ones are ordinary text.
  - `encode(text, add_special_tokens=True)` puts BOS (EOS) around the ids as the add_bos (add_eos) flags say.
  - Decode: "▁" back to space, runs of byte pieces back into UTF-8 (an invalid byte becomes U+FFFD).
  """
  def __init__(self, pieces: Sequence[str], token_types: Sequence[int], bos_id: int, eos_id: int, unknown_id: int,
               padding_id: int | None = None, add_bos: bool = True, add_eos: bool = False,
               add_space_prefix: bool = False):
    if len(pieces) != len(token_types):
      raise ValueError(f"{len(pieces)} pieces but {len(token_types)} token types")
    for name, token_id in (("bos", bos_id), ("eos", eos_id), ("unknown", unknown_id), ("padding", padding_id)):
      if token_id is not None and not 0 <= token_id < len(pieces):
        raise ValueError(f"{name} id {token_id} is outside the vocabulary of {len(pieces)} pieces")
    self.pieces, self.token_types = list(pieces), [TokenType(t) for t in token_types]
    self.bos_id, self.eos_id, self.unknown_id, self.padding_id = bos_id, eos_id, unknown_id, padding_id
    self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
    self.backend = self._build_backend()
    self.special_ids = frozenset(i for i, t in enumerate(self.token_types) if t == TokenType.CONTROL)
    end_of_turn = self.piece_to_id(END_OF_TURN)
    # generation stops at EOS, and in a chat also at the end of the model's turn
    self.stop_ids: tuple[int, ...] = (eos_id,) + ((end_of_turn,) if end_of_turn is not None else ())

  @classmethod
  def from_metadata(cls, metadata: Mapping[str, Any]) -> GGUFTokenizer:
    """From a GGUF metadata dict (keys `tokenizer.ggml.*`, values as Python lists, ints and bools)."""
    def get(key: str, default: Any = None, required: bool = False) -> Any:
      if required and METADATA_PREFIX + key not in metadata:
        raise KeyError(f"GGUF metadata has no {METADATA_PREFIX + key}; keys present: "
                       f"{sorted(k for k in metadata if k.startswith(METADATA_PREFIX))}")
      return metadata.get(METADATA_PREFIX + key, default)
    model = get("model", required=True)
    if model != SENTENCEPIECE_MODEL:
      raise ValueError(f"tokenizer.ggml.model is {model!r}; only SentencePiece ({SENTENCEPIECE_MODEL!r}) is supported")
    pieces = list(get("tokens", required=True))
    token_types = list(get("token_type", required=True))
    return cls(pieces, token_types, bos_id=int(get("bos_token_id", required=True)),
               eos_id=int(get("eos_token_id", required=True)), unknown_id=int(get("unknown_token_id", required=True)),
               padding_id=get("padding_token_id"), add_bos=bool(get("add_bos_token", True)),
               add_eos=bool(get("add_eos_token", False)), add_space_prefix=bool(get("add_space_prefix", False)))

  # ---- building the `tokenizers` pipeline

  def _build_backend(self) -> Tokenizer:
    spelled = [self._spell(piece) for piece in self.pieces]
    vocab = {piece: i for i, piece in enumerate(spelled)}   # a piece listed twice keeps its last id (and rank)
    model = BPE(vocab=vocab, merges=merges_in_file_order(spelled, vocab), unk_token=spelled[self.unknown_id],
                fuse_unk=True, byte_fallback=True)
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Replace(" ", SPACE_MARK)
    if self.add_space_prefix:   # one "▁" before the text's first piece only, not after each control token
      backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()])
    kept_whole = lambda kind: [AddedToken(p, special=kind == TokenType.CONTROL, normalized=False)
                               for p, s, t in zip(self.pieces, spelled, self.token_types) if t == kind and p == s]
    backend.add_special_tokens(kept_whole(TokenType.CONTROL))
    backend.add_tokens(kept_whole(TokenType.USER_DEFINED))
    return backend

  @staticmethod
  def _spell(piece: str) -> str:
    """Gemma files store pieces made only of spaces with real spaces; text reaches BPE as "▁", so spell them so."""
    return SPACE_MARK * len(piece) if " " in piece and not piece.strip(" ") else piece

  # ---- the public API

  @property
  def vocab_size(self) -> int: return len(self.pieces)

  def piece_to_id(self, piece: str) -> int | None: return self.backend.token_to_id(piece)

  def id_to_piece(self, token_id: int) -> str:
    self._check_ids([token_id])
    return self.pieces[token_id]

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`; with `add_special_tokens`, BOS first (EOS last) as the file's add_bos (add_eos) say."""
    return self._wrap(self.backend.encode(text, add_special_tokens=False).ids, add_special_tokens)

  def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    """`encode` of each text, run on all cores by the `tokenizers` library."""
    encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
    return [self._wrap(e.ids, add_special_tokens) for e in encodings]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """The text of `ids`; with `skip_special_tokens`, control tokens (BOS, EOS, turn markers, ...) are left out."""
    ids = [int(i) for i in ids]
    self._check_ids(ids)
    return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

  def _wrap(self, ids: list[int], add_special_tokens: bool) -> list[int]:
    if not add_special_tokens: return ids
    return ([self.bos_id] if self.add_bos else []) + ids + ([self.eos_id] if self.add_eos else [])

  def _check_ids(self, ids: Sequence[int]) -> None:
    bad = [i for i in ids if not 0 <= i < len(self.pieces)]
    if bad: raise ValueError(f"token ids {bad[:8]} are outside the vocabulary of {len(self.pieces)} pieces")

def merges_in_file_order(pieces: Sequence[str], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
  """Every way to make a piece from two pieces, best first: by the joined piece's position in the file (its rank),
  then by the longer left part. A BPE that applies the best available pair each step reproduces SentencePiece's
  "merge the adjacent pair whose joined piece scores highest"."""
  merges = []
  for rank, piece in enumerate(pieces):
    if vocab[piece] != rank: continue   # a repeated piece ranks at its last position, where it is reached
    for cut in range(len(piece) - 1, 0, -1):
      if (left := piece[:cut]) in vocab and (right := piece[cut:]) in vocab: merges.append((left, right))
  return merges

def _content_text(content: str | Sequence[Mapping[str, Any]]) -> str:
  """A message's content as the template writes it: a string stripped, or its parts in order (text parts
  stripped, an image as <start_of_image>)."""
  if isinstance(content, str): return content.strip()
  parts = []
  for item in content:
    if item.get("type") == "text": parts.append(item["text"].strip())
    elif item.get("type") == "image": parts.append(START_OF_IMAGE)
    else: raise ValueError(f"message content part of type {item.get('type')!r}; expected 'text' or 'image'")
  return "".join(parts)

def apply_chat_template(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
  """Gemma 3's chat prompt: `<bos>`, then `<start_of_turn>{role}\\n{content}<end_of_turn>\\n` per turn, with
  "assistant" written "model"; a leading system message is not a turn but a prefix of the first turn's content,
  followed by a blank line. Turns must alternate user/assistant starting with user. With `add_generation_prompt`
  it ends with `<start_of_turn>model\\n`. Encode the result with `add_special_tokens=False` (it has its <bos>)."""
  turns, first_prefix = list(messages), ""
  if turns and turns[0]["role"] == "system":
    system = turns[0]["content"]
    first_prefix = (system if isinstance(system, str) else system[0]["text"]) + "\n\n"
    turns = turns[1:]
  out = [BOS_TEXT]
  for i, message in enumerate(turns):
    if (message["role"] == "user") != (i % 2 == 0):
      raise ValueError(f"conversation roles must alternate user/assistant/..., got {[m['role'] for m in turns]}")
    role = "model" if message["role"] == "assistant" else message["role"]
    out.append(f"{START_OF_TURN}{role}\n{first_prefix if i == 0 else ''}{_content_text(message['content'])}"
               f"{END_OF_TURN}\n")
  if add_generation_prompt: out.append(f"{START_OF_TURN}model\n")
  return "".join(out)
