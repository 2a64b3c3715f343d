"""How much of tinygrad's Tensor API tgrad's Tensor has: the public method and property names of tinygrad's Tensor
(tinygrad/tensor.py and the mixins it inherits from, tinygrad/mixin/*.py, at the 0.14 line) held here as data, checked
against `tgrad.Tensor` with hasattr. Prints the count and the missing names (docs/api_coverage.md says why each is
missing). Run: PYTHONPATH=. python bench/api_coverage.py
"""
from tgrad import Tensor

# The names, grouped as tinygrad's docs group them. Private helpers (a leading underscore) and operator dunders are
# left out; the operators are covered by their named methods (add, mul, matmul, lshift, ...).
TINYGRAD_TENSOR_API: dict[str, tuple[str, ...]] = {
  "properties and state": ("shape", "dtype", "device", "ndim", "T", "grad", "requires_grad", "training", "uop",
                           "CHUNK_SIZE"),
  "creation": ("empty", "empty_like", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "arange",
               "linspace", "eye", "rand", "rand_like", "randn", "randn_like", "randint", "normal", "uniform",
               "scaled_uniform", "glorot_uniform", "kaiming_uniform", "kaiming_normal", "randperm", "multinomial",
               "manual_seed", "from_blob", "from_url", "from_uop", "invalids", "const_like"),
  "data access": ("data", "item", "tolist", "numpy", "clone", "to", "to_", "shard", "shard_", "shard_like", "assign",
                  "replace", "detach", "realize", "schedule", "schedule_with_vars", "contiguous",
                  "contiguous_backward", "fs_load", "fs_store", "as_param", "call", "custom_kernel"),
  "autograd": ("gradient", "backward", "requires_grad_", "train"),
  "movement": ("reshape", "view", "expand", "permute", "flip", "shrink", "shrink_to", "pad", "pad_to", "squeeze",
               "unsqueeze", "transpose", "flatten", "unflatten", "rearrange", "split", "chunk", "meshgrid", "diag",
               "diagonal", "roll", "repeat", "repeat_interleave", "unfold", "cat", "stack", "gather", "scatter",
               "scatter_reduce", "masked_select", "masked_fill", "nonzero", "one_hot", "numel", "size"),
  "reduce": ("sum", "prod", "max", "min", "any", "all", "mean", "var", "var_mean", "std", "std_mean", "softmax",
             "log_softmax", "logsumexp", "logcumsumexp", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
             "isclose", "allclose", "sort", "argsort", "topk", "einsum", "usum", "uprod"),
  "processing": ("avg_pool2d", "max_pool2d", "max_unpool2d", "conv2d", "conv_transpose2d", "dot", "matmul", "triu",
                 "tril", "interpolate", "keccak", "hash", "newton_schulz", "qr", "svd", "image_dot", "image_conv2d",
                 "decode_hevc_frame"),
  "elementwise": ("logical_not", "neg", "log", "log10", "log2", "exp", "exp2", "sqrt", "rsqrt", "sin", "cos", "tan",
                  "asin", "acos", "atan", "sinh", "cosh", "atanh", "asinh", "acosh", "erf", "trunc", "ceil", "floor",
                  "round", "isnan", "isinf", "isfinite", "lerp", "square", "clamp", "clip", "sign", "abs",
                  "reciprocal", "relu", "sigmoid", "hardsigmoid", "relu6", "hardswish", "hardtanh", "leaky_relu",
                  "tanh", "gelu", "quick_gelu", "swish", "silu", "elu", "celu", "selu", "softplus", "mish",
                  "logsigmoid", "softsign", "add", "sub", "mul", "div", "mod", "fmod", "pow", "maximum", "minimum",
                  "where", "copysign", "logaddexp", "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor",
                  "lshift", "rshift", "ne", "eq", "threefry", "ufix", "alu"),
  "neural network": ("linear", "sequential", "layernorm", "batchnorm", "dropout", "scaled_dot_product_attention",
                     "binary_crossentropy", "binary_crossentropy_logits", "sparse_categorical_crossentropy",
                     "cross_entropy", "nll_loss"),
  "dtype": ("cast", "bitcast", "float", "half", "int", "bool", "bfloat16", "double", "long", "short", "element_size",
            "nbytes", "is_floating_point"),
}

# Why each name tgrad lacks is missing (docs/api_coverage.md shows this table).
MISSING_REASONS: dict[str, str] = {
  "uop": "tinygrad's lazy graph node; tgrad's is `lazydata` (a LazyBuffer), a different type with a different API",
  "CHUNK_SIZE": "the chunk size of tinygrad's tinyfs storage (fs_load/fs_store), which tgrad does not have",
  "from_blob": "wraps a raw device pointer without copying; tgrad's allocators own every buffer they hand out",
  "from_url": "downloads into a DISK tensor; tgrad has no DISK device (and makes no network requests)",
  "from_uop": "builds a Tensor from a symbolic UOp expression; tgrad's Variables bind through tensor ops instead",
  "invalids": "a tensor of tinygrad's Invalid value (an anonymous buffer); tgrad has no Invalid constant",
  "fs_load": "tinyfs, tinygrad's content-addressed network storage device",
  "fs_store": "tinyfs, tinygrad's content-addressed network storage device",
  "as_param": "a PARAM UOp for tinygrad's function-call graphs (`call`), which tgrad's lazy graph has no op for",
  "call": "calls a captured UOp function graph (tinygrad's CALL op); tgrad has TinyJit but no callable subgraphs",
  "custom_kernel": "user kernels written in tinygrad UOps; tgrad's kernels come from its own scheduler and renderers",
  "image_dot": "the IMAGE=1/2 path for Qualcomm GPUs' texture memory (image dtypes), which tgrad has no device for",
  "image_conv2d": "the IMAGE=1/2 path for Qualcomm GPUs' texture memory (image dtypes), which tgrad has no device for",
  "decode_hevc_frame": "hardware HEVC video decode (tinygrad's ENCDEC op on NV/AMD video engines)",
  "threefry": "the THREEFRY ALU op of tinygrad's RNG; tgrad's RNG is a counter hash (murmur3 finalizer) in plain ops",
  "alu": "applies one of tinygrad's UOp ops directly; tgrad's Ops enum differs, and its methods cover every op",
}

def missing_names() -> list[str]:
  sample = Tensor([0.0])   # instance attributes (grad, requires_grad) exist on a tensor, not on the class
  names = [name for group in TINYGRAD_TENSOR_API.values() for name in group]
  return [name for name in names if not (hasattr(Tensor, name) or hasattr(sample, name))]

def main() -> None:
  names = [name for group in TINYGRAD_TENSOR_API.values() for name in group]
  assert len(names) == len(set(names)), "a name is listed twice"
  missing = missing_names()
  print(f"tgrad's Tensor has {len(names) - len(missing)} of tinygrad's {len(names)} public Tensor names")
  for name in missing: print(f"  missing {name}: {MISSING_REASONS.get(name, '(no reason written down)')}")

if __name__ == "__main__": main()
