"""The CPU kernels' objects hold only 64-bit relocations (runtime/llvm/runtime.py CODE_MODEL): MCJIT maps an object's
code, its constants and the library functions it calls wherever mmap puts them, and a 32-bit PC-relative reference
that must reach more than 2 GiB aborts the process in finalize_object (seen on a host with a GPU driver loaded, whose
address space is large). Kernels with float constants, libm calls, a matmul and a softmax are compiled, and every
relocation of their objects is checked to be one of x86-64's 64-bit kinds."""
import platform, sys
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.runtime.llvm import runtime

# x86-64 relocation types (System V ABI, AMD64 supplement) whose field is 64 bits wide: R_X86_64_64, PC64, GOTOFF64,
# GOT64, GOTPCREL64, GOTPC64, GOTPLT64, PLTOFF64
WIDE_RELOCATIONS = {1, 24, 25, 27, 28, 29, 30, 31}
SHT_RELA = 4

def relocation_types(binary: bytes) -> list[int]:
  header = runtime.ELF_HEADER.unpack_from(binary)
  table, sections = header[6], header[12]
  types = []
  for i in range(sections):
    section = runtime.ELF_SECTION.unpack_from(binary, table + i * runtime.ELF_SECTION.size)
    if section[1] != SHT_RELA: continue
    for start in range(section[4], section[4] + section[5], runtime.ELF_RELA.size):
      types.append(runtime.ELF_RELA.unpack_from(binary, start)[1] & 0xFFFFFFFF)
  return types

@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                    reason="checks x86-64 ELF objects")
def test_kernel_objects_have_only_64_bit_relocations(monkeypatch):
  objects = []
  compile_source = runtime.LLVMCompiler._compile
  def keep(self, source):
    objects.append(binary := compile_source(self, source))
    return binary
  monkeypatch.setattr(runtime.LLVMCompiler, "_compile", keep)
  a = Tensor(np.random.default_rng(0).standard_normal((37, 29)).astype(np.float32), device="LLVM")
  (a.exp() * 1.7 + a.sin() - 0.25).sum(1).realize()
  (a @ a.T).relu().realize()
  a.softmax(1).realize()
  assert objects, "no kernel was compiled (a cache hit?)"
  types = [t for binary in objects for t in relocation_types(binary)]
  assert types, "the kernels reference no constants at all: the check checks nothing"
  assert set(types) <= WIDE_RELOCATIONS, f"32-bit relocations in the kernels' objects: {sorted(set(types))}"
