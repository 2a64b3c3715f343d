"""Model definitions built from tgrad Tensors (imported by examples and tests, never by the core library).

`tgrad.models.gemma3`: Gemma 3 text models (google/gemma-3-270m and the rest of the family) with HF checkpoint
loading and a preallocated KV cache; `tgrad.models.generation`: token generation with them.
"""
