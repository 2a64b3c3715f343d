"""Hand-coded default optimizations: readable rules, each constant named with where it comes from.

Filled in with the OptOps work; for now a kernel runs as plain loops (every rule below is skipped).
"""
from __future__ import annotations
from tgrad.codegen.kernel import Kernel

def hand_coded_optimizations(kernel: Kernel) -> None:
  return None
