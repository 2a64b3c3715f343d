"""Linear algebra: matmul/dot (numpy's rules for 1-D operands and batch broadcasting), einsum, and the triangles
tril/triu. Products are a broadcast multiply and a sum, so they fuse and get their gradients from the chain rule.
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Optional
from tgrad.dtype import least_upper_dtype, to_dtype
from tgrad.tensor_ops.args import broadcast_shape
from tgrad.regions import composite
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

# cyclic Jacobi sweeps of svd: the method converges quadratically, and 6 sweeps reach float32 precision (torch's
# singular values to 1e-6 relative) on random matrices up to 8×8 (8×8: 168 rotations, 6.5 s on the CPU device)
SVD_SWEEPS = 6

class LinalgMixin:
  """Tensor's matrix products and triangles."""
  # ---- matrix products
  def dot(self, w: Tensor, acc_dtype: Any = None) -> Tensor:
    """numpy's matmul: 1-D operands are vectors, leading dims broadcast as a batch. Bad shapes (a 0-d operand,
    inner dims that differ) raise RuntimeError, as torch."""
    w = self._as_tensor(w)
    if self.ndim == 0 or w.ndim == 0:
      raise RuntimeError(f"matmul needs at least 1-D operands, got {self.shape} and {w.shape}")
    x, y = self.reshape(1, -1) if self.ndim == 1 else self, w.reshape(-1, 1) if w.ndim == 1 else w
    if x.shape[-1] != y.shape[-2]:
      raise RuntimeError(f"matmul: inner dimensions differ: {self.shape} @ {w.shape} ({x.shape[-1]} != {y.shape[-2]})")
    try: broadcast_shape(x.shape[:-2], y.shape[:-2])
    except ValueError:
      raise RuntimeError(f"matmul: batch dims of {self.shape} and {w.shape} do not broadcast") from None
    # the composite "matmul" (tensor_ops/composite.py): a broadcast multiply and a sum over k
    return composite("matmul", (self, w), acc_dtype=None if acc_dtype is None else to_dtype(acc_dtype).name)
  def matmul(self, x: Tensor, reverse: bool = False) -> Tensor:
    return self._as_tensor(x).dot(self) if reverse else self.dot(x)
  @staticmethod
  def einsum(formula: str, *operands, acc_dtype: Any = None) -> Tensor:
    """Einstein summation, e.g. "ij,jk->ik", "bij,bjk->bik", "ii->i" (diagonal), "ii" (trace), "i,j->ij",
    "...ij->...ji", "->" and ",i->i" (0-d operands). Built from diagonal views, permutes, broadcast multiplies and one
    sum. A formula that does not fit the operands raises RuntimeError, as torch."""
    tensors = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    return _einsum(formula, tensors, acc_dtype)

  # ---- factorizations
  def qr(self) -> tuple[Tensor, Tensor]:
    """Householder QR of the last two dims (m, n), as LAPACK's geqrf (torch.linalg.qr(mode='complete')): Q (m, m)
    orthogonal, R (m, n) upper triangular with R[i, i] = −sign(x₀)·‖x‖, and no reflection where a column is already
    reduced. min(m − 1, n) reflections, each a rank-1 update of R and Q; differentiable."""
    if self.ndim < 2: raise RuntimeError(f"qr: expected a tensor with 2 or more dimensions, got shape {self.shape}")
    m, n = self.shape[-2:]
    R = self._to_float()
    Q = Tensor.eye(m, dtype=R.dtype, device=self.device).reshape((1,) * (self.ndim - 2) + (m, m))
    Q = Q._broadcast_to(self.shape[:-2] + (m, m))
    rows = Tensor.arange(m, device=self.device)
    for i in range(min(m - 1, n)):
      column = R[..., :, i] * (rows >= i)                                   # x below the diagonal, zeros above
      alpha = R[..., i, i]
      rest_norm = (column * (rows > i)).square().sum(-1).sqrt()
      norm = column.square().sum(-1).sqrt()
      sign = (alpha >= 0).where(-1.0, 1.0)                                 # −sign(alpha), −1 at 0 (LAPACK's beta)
      pivot = alpha - sign * norm                                          # v = x / pivot, v[i] = 1
      reflect = rest_norm != 0
      safe_pivot = reflect.where(pivot, 1.0)
      v = (rows == i).where(1.0, column / safe_pivot.unsqueeze(-1))
      tau = reflect.where(-sign * pivot / reflect.where(norm, 1.0), 0.0)  # H = I − tau·v·vᵀ
      v_col, v_row = v.unsqueeze(-1), v.unsqueeze(-2)
      R = R - (tau.unsqueeze(-1).unsqueeze(-1) * v_col) * (v_row @ R)
      Q = Q - ((Q @ v_col) * tau.unsqueeze(-1).unsqueeze(-1)) @ v_row
    return Q, R.triu()
  def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """U, S, Vᵀ of the last two dims (m, n), as torch.linalg.svd: S descending, U (m, m) and Vᵀ (n, n) orthogonal
    (U (m, k), Vᵀ (k, n) with full_matrices=False, k = min(m, n)); the signs of singular vector pairs may differ from
    torch's. A QR first (R's top k rows), then one-sided Jacobi rotations of column pairs (SVD_SWEEPS cyclic sweeps,
    unrolled: meant for small matrices), then a sort. U's columns for zero singular values are 0 in the thin part."""
    if self.ndim < 2: raise RuntimeError(f"svd: expected a tensor with 2 or more dimensions, got shape {self.shape}")
    m, n = self.shape[-2:]
    if m < n:
      u, s, vt = self.transpose(-2, -1).svd(full_matrices)
      return vt.transpose(-2, -1), s, u.transpose(-2, -1)
    q, r = self.qr()
    work, lead = r[..., :n, :], self.shape[:-2]
    v = Tensor.eye(n, dtype=work.dtype, device=self.device).reshape((1,) * len(lead) + (n, n))
    v = v._broadcast_to(lead + (n, n))
    columns = Tensor.arange(n, device=self.device)
    for _ in range(SVD_SWEEPS):
      for p in range(n - 1):
        for k in range(p + 1, n):
          work_p, work_k = work[..., :, p], work[..., :, k]
          alpha, beta, gamma = work_p.square().sum(-1), work_k.square().sum(-1), (work_p * work_k).sum(-1)
          rotate = gamma != 0
          zeta = (beta - alpha) / (2 * rotate.where(gamma, 1.0))
          tangent = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
          cosine = (1 + rotate.where(tangent, 0.0).square()).rsqrt()
          sine = cosine * rotate.where(tangent, 0.0)
          work, v = (_rotate_columns(x, p, k, cosine, sine, columns) for x in (work, v))
    s = work.square().sum(-2).sqrt()
    order = s.argsort(-1, descending=True)                                   # sort by a permutation matrix
    permutation = (order.unsqueeze(-2) == columns.reshape(n, 1)).cast(work.dtype)   # [i, j]: column order[j] = i
    s, work, v = (s.unsqueeze(-2) @ permutation).squeeze(-2), work @ permutation, v @ permutation
    u_small = work / (s != 0).where(s, 1.0).unsqueeze(-2)                    # (n, n): R's left singular vectors
    u = q[..., :, :n] @ u_small if not full_matrices else q @ u_small.pad(((0, 0),) * len(lead) + ((0, m - n), (0, 0)))
    if full_matrices and m > n: u = u.cat(q[..., :, n:], dim=-1)
    return u, s, v.transpose(-2, -1)
  def newton_schulz(self, steps: int, params: tuple, eps: float = 1.0e-7) -> Tensor:
    """The Newton–Schulz iteration toward the orthogonal factor of the last two dims (Muon's): X ← Σᵢ pᵢ·(XXᵀ)ⁱX
    on X normalized by its Frobenius norm (+ eps); a tall matrix is iterated transposed."""
    if self.ndim < 2: raise RuntimeError(f"newton_schulz: needs 2 or more dims, got shape {self.shape}")
    if self.shape[-2] > self.shape[-1]:
      return self.transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1)
    x = self / (self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
      gram, term, total = x @ x.transpose(-2, -1), x, None
      for coefficient in params:
        total = term * coefficient if total is None else total + term * coefficient
        term = gram @ term
      x = total if total is not None else x * 0
    return x

  # ---- triangles
  def _triangle_mask(self, diagonal: int, lower: bool) -> Tensor:
    """True on and below (lower) or on and above the `diagonal`-th diagonal of the last two dims."""
    if self.ndim < 2:
      raise RuntimeError(f"{'tril' if lower else 'triu'}: input tensor must have at least 2 dimensions, got shape "
                         f"{self.shape}")
    rows, cols = self.shape[-2:]
    column = Tensor.arange(cols, device=self.device).reshape(1, cols)
    offset = column - Tensor.arange(rows, device=self.device).reshape(rows, 1)   # column − row
    return offset <= diagonal if lower else offset >= diagonal
  def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (column − row <= diagonal); zeros elsewhere."""
    return self._triangle_mask(diagonal, lower=True).where(self, self.zeros_like())
  def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (column − row >= diagonal); zeros elsewhere."""
    return self._triangle_mask(diagonal, lower=False).where(self, self.zeros_like())

def _rotate_columns(x: Tensor, p: int, k: int, cosine: Tensor, sine: Tensor, columns: Tensor) -> Tensor:
  """x with columns p and k replaced by their Givens rotation (c·x_p − s·x_k, s·x_p + c·x_k); c, s per batch."""
  c, s = cosine.unsqueeze(-1), sine.unsqueeze(-1)
  x_p, x_k = x[..., :, p], x[..., :, k]
  rotated_p, rotated_k = (c * x_p - s * x_k).unsqueeze(-1), (s * x_p + c * x_k).unsqueeze(-1)
  return (columns == p).where(rotated_p, (columns == k).where(rotated_k, x))

def _einsum(formula: str, tensors: list[Tensor], acc_dtype: Any) -> Tensor:
  formula = formula.replace(" ", "")
  lhs, arrow, rhs = formula.partition("->")
  specs = lhs.split(",")
  if len(specs) != len(tensors):
    raise RuntimeError(f"einsum {formula!r} names {len(specs)} operands, got {len(tensors)}")
  spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in formula]
  ellipsis_ndim = max((t.ndim - (len(s) - 3) for s, t in zip(specs, tensors) if "..." in s), default=0)
  ellipsis_letters = "".join(spare[:ellipsis_ndim])
  letters_per_operand = []
  for spec, t in zip(specs, tensors):
    if "..." in spec:
      own = t.ndim - (len(spec) - 3)
      if own < 0: raise RuntimeError(f"einsum operand {spec!r} has more letters than dims of shape {t.shape}")
      spec = spec.replace("...", ellipsis_letters[len(ellipsis_letters) - own:])
    if len(spec) != t.ndim or (spec and not spec.isalpha()):
      raise RuntimeError(f"einsum operand {spec!r} does not match a tensor of shape {t.shape}")
    letters_per_operand.append(spec)
  if arrow:
    out_letters = rhs.replace("...", ellipsis_letters)
    if not out_letters.isalpha() and out_letters: raise RuntimeError(f"bad einsum output {rhs!r}")
  else:
    counts = {c: sum(s.count(c) for s in letters_per_operand) for c in set("".join(letters_per_operand))}
    single = sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis_letters)
    out_letters = ellipsis_letters + "".join(single)
  # take diagonals where a letter repeats within one operand
  prepared = []
  for spec, t in zip(letters_per_operand, tensors):
    while (repeated := next((c for c in spec if spec.count(c) > 1), None)) is not None:
      a = spec.index(repeated)
      b = spec.index(repeated, a + 1)
      if t.shape[a] != t.shape[b]:
        raise RuntimeError(f"einsum: letter {repeated!r} has sizes {t.shape[a]} and {t.shape[b]} in shape {t.shape}")
      others = [i for i in range(t.ndim) if i not in (a, b)]
      n = t.shape[a]
      t = t.permute(others + [a, b]).reshape(*[t.shape[i] for i in others], n * n)
      t = t._stride((1,) * len(others) + (n + 1,))
      spec = "".join(spec[i] for i in others) + repeated
    prepared.append((spec, t))
  sizes: dict[str, int] = {}
  for spec, t in prepared:
    for c, s in zip(spec, t.shape):
      if c in sizes and 1 not in (sizes[c], s) and sizes[c] != s:
        raise RuntimeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s} in {formula!r}")
      if c not in sizes or sizes[c] == 1: sizes[c] = s
  for c in out_letters:
    if c not in sizes: raise RuntimeError(f"einsum output letter {c!r} is not in any operand of {formula!r}")
    if out_letters.count(c) > 1: raise RuntimeError(f"einsum output letter {c!r} repeats in {formula!r}")
  summed = [c for c in sizes if c not in out_letters]
  order = list(out_letters) + summed
  product: Optional[Tensor] = None
  for spec, t in prepared:   # put each operand's axes in the global order, with size-1 axes for missing letters
    axes_in_order = sorted(range(len(spec)), key=lambda i: order.index(spec[i]))
    own_sizes = {spec[i]: t.shape[i] for i in axes_in_order}
    aligned = t.permute(axes_in_order).reshape(tuple(own_sizes.get(c, 1) for c in order))
    product = aligned if product is None else product * aligned
  assert product is not None
  product = product._broadcast_to(tuple(sizes[c] for c in order))
  out = product.sum(tuple(range(len(out_letters), len(order))), acc_dtype=acc_dtype) if summed else product
  return out.cast(least_upper_dtype(*[t.dtype for t in tensors]))
