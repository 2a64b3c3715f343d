"""Tensor's methods, grouped by concern: one mixin class per file, combined into `Tensor` in tgrad/tensor.py.

creation.py (full, arange, rand, ...), elementwise.py (arithmetic, comparisons, math, activations, operators),
reduce.py (sum, max, softmax, cumsum, ...), movement.py (reshape, pad, cat, roll, unfold, ...), indexing.py (`t[i]`,
gather, scatter, one_hot, diagonal, masked_select), linalg.py (matmul, einsum, tril), neural.py (conv, pooling, norms,
attention, losses), sorting.py (sort, argsort, topk), hashing.py (keccak, hash); args.py holds the argument checks
they share, composite.py the Tensor-level lowerings of the composite ops (exp, tanh, softmax, matmul, ...) that methods
call through tgrad/regions.py: lazy-graph regions with alternative lowerings.
The mixins (and composite.py) name `Tensor` in their bodies (`Tensor.arange(...)`, `isinstance(x, Tensor)`) but
cannot import tgrad/tensor.py, which imports them: tensor.py hands them the class with `bind_tensor_class` as soon
as it exists, before any method runs (and so do tgrad/function.py, whose `apply` makes Tensors, and regions.py,
which builds lowerings on Tensors).
"""
from tgrad import function, regions
from tgrad.tensor_ops import (composite, creation, elementwise, reduce, movement, indexing, linalg, neural, sorting,
                              hashing)

MIXIN_MODULES = (creation, elementwise, reduce, movement, indexing, linalg, neural, sorting, hashing)

def bind_tensor_class(tensor_class: type) -> None:
  """Make `Tensor` in each mixin module the finished class (tgrad/tensor.py calls this once, right after it)."""
  for module in MIXIN_MODULES + (composite, function): module.Tensor = tensor_class  # type: ignore[attr-defined]
  regions.bind_value_type(tensor_class)
