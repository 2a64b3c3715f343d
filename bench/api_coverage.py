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

def main() -> None:
  names = [name for group in TINYGRAD_TENSOR_API.values() for name in group]
  assert len(names) == len(set(names)), "a name is listed twice"
  sample = Tensor([0.0])   # instance attributes (grad, requires_grad) exist on a tensor, not on the class
  missing = [name for name in names if not (hasattr(Tensor, name) or hasattr(sample, name))]
  print(f"tgrad's Tensor has {len(names) - len(missing)} of tinygrad's {len(names)} public Tensor names")
  for group, group_names in TINYGRAD_TENSOR_API.items():
    absent = [n for n in group_names if n in missing]
    if absent: print(f"  missing ({group}): {', '.join(absent)}")

if __name__ == "__main__": main()
