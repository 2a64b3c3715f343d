"""A get_runner wrapper that also compiles every new kernel for CUDA without a GPU (shared by conftest.py's opt-in
fixture and test/fuzz_ops.py --cuda-codegen-check): the kernel is optimized with the GPU heuristics, rendered by
CUDARenderer and compiled by NVRTC for sm_90; a render or compile error raises where the kernel was scheduled."""
from typing import Callable

CHECK_ARCH = "sm_90"

def checking_cuda(get_runner: Callable, function_name: str) -> Callable:
  """get_runner, wrapped: each AST it has not seen is first compiled for CUDA under `function_name`."""
  from tgrad.codegen.kernel import Kernel
  from tgrad.codegen.linearizer import linearize
  from tgrad.codegen.heuristics import hand_coded_optimizations
  from tgrad.runtime.cuda.renderer import CUDARenderer
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  checked: set = set()
  def get_runner_checking_cuda(device, ast, *rest):
    if ast.key not in checked:
      kernel = Kernel(ast, CUDARenderer())
      hand_coded_optimizations(kernel)
      compile_cuda(kernel.renderer.render(function_name, linearize(kernel)), CHECK_ARCH)
      checked.add(ast.key)
    return get_runner(device, ast, *rest)
  return get_runner_checking_cuda
