"""LLVM backend specifics: generated-code properties and regressions of the CPU compiler path."""
import re
import numpy as np
from tgrad.tensor import Tensor
from tgrad.schedule import create_schedule
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.device import Device
from tgrad.ops import Ops

def test_modulo_index_under_vectorization():
  # a merging reshape over a broadcast reads c at t*16 + j%16; with i32 index math LLVM 22 vectorized it as t*16 + j
  rng = np.random.default_rng(0)
  q, c, s = rng.random((1, 24, 2, 32), np.float32), rng.random((1, 24, 1, 1, 16), np.float32), \
    rng.random((1, 24, 1, 2, 16), np.float32)
  h = Tensor(q).reshape(1, 24, 2, 2, 16)
  out = (h * Tensor(c) + h * Tensor(s)).reshape(1, 24, 2, 32).numpy()
  hn = q.reshape(1, 24, 2, 2, 16)
  np.testing.assert_allclose(out, (hn * c + hn * s).reshape(1, 24, 2, 32), rtol=1e-6)

def test_index_math_is_64_bit_and_data_math_keeps_its_width():
  x = Tensor(np.arange(12, dtype=np.int32)).realize()
  out = (x.reshape(3, 4).permute(1, 0) + Tensor.arange(4).reshape(4, 1)).contiguous()
  item = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK][-1]
  src = Device["LLVM"].renderer.render("k", linearize(Kernel(item.ast, Device["LLVM"].renderer)))
  assert re.search(r"phi\s+i64", src) and "phi  i32" not in src, "loop counters are i64"
  assert re.search(r"getelementptr inbounds i32, ptr %\S+, i64", src), "addresses are indexed in i64"
  assert re.search(r"= add i32 %", src), "the int32 data sum stays 32-bit"
  np.testing.assert_array_equal(out.numpy(), np.arange(12).reshape(3, 4).T + np.arange(4).reshape(4, 1))

def test_contiguous_elementwise_loop_has_plain_vector_code():
  a, b = Tensor.rand(4096).realize(), Tensor.rand(4096).realize()
  item = [i for i in create_schedule([(a * b + 1).lazydata]) if i.ast.op is Ops.SINK][-1]
  kernel = Kernel(item.ast, Device["LLVM"].renderer)
  src = Device["LLVM"].renderer.render("k", linearize(kernel))
  assert "srem" not in src and "sdiv" not in src and "select" not in src   # no index division, no masks

def test_exponential_converts_no_float_to_int():
  # AVX2 has no saturating float → int vector conversion: llvm.fptosi.sat in exp2's range reduction was scalarized,
  # eight conversions per vector of the exponential (softmax ran at scalar speed)
  data = np.linspace(-80, 80, 4097, dtype=np.float32)
  x = Tensor(data).realize()
  item = [i for i in create_schedule([x.exp().lazydata]) if i.ast.op is Ops.SINK][-1]
  src = Device["LLVM"].renderer.render("k", linearize(Kernel(item.ast, Device["LLVM"].renderer)))
  assert "fptosi" not in src and "llvm.trunc" not in src
  np.testing.assert_allclose(x.exp().numpy(), np.exp(data.astype(np.float64)), rtol=1e-5)   # x·log2(e) rounds
