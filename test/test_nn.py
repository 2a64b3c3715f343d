"""Neural-network ops and layers against torch 2.x (CPU): forward values and gradients, and user errors.

Ops: conv2d / conv_transpose2d, the pools, interpolate, dropout, the norms, attention, one_hot, the losses, gather
and scatter. Layers (tgrad.nn): each is loaded with a torch module's state dict through `load_state_dict`, then its
output and its parameters' gradients are compared with the module's; BatchNorm's running statistics too.
"""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes
import tgrad.nn as nn
from tgrad.nn.state import get_state_dict, get_parameters, load_state_dict

ATOL, RTOL = 1e-5, 1e-5     # float32; gradients get 10× (the fixture's default)
CONV_ATOL = 1e-4            # sums of a few dozen products
RNG = np.random.default_rng(0)

# ---------------------------------------------------------------------------------------------------------------
# convolution

CONV_CASES = [  # id, input shape, weight shape, kwargs for both
  ("bias", (2, 3, 7, 7), (4, 3, 3, 3), dict(bias=True)),
  ("stride_padding_dilation_groups", (2, 4, 9, 8), (6, 2, 3, 2), dict(stride=(2, 3), padding=(1, 2), dilation=(2, 1),
                                                                      groups=2)),
  ("stride_larger_than_kernel", (1, 1, 5, 7), (2, 1, 1, 2), dict(stride=4)),
  ("depthwise", (1, 3, 6, 6), (3, 1, 3, 3), dict(groups=3, padding=1)),
  ("same", (2, 2, 6, 5), (3, 2, 4, 3), dict(padding="same", dilation=(1, 2))),
]

@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")   # torch's performance note
@pytest.mark.parametrize("name, x_shape, w_shape, kwargs", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv2d(compare_with_torch, name, x_shape, w_shape, kwargs):
  kwargs = dict(kwargs)
  shapes = [x_shape, w_shape] + ([(w_shape[0],)] if kwargs.pop("bias", False) else [])
  compare_with_torch(lambda x, w, *b: F.conv2d(x, w, *b, **kwargs), lambda x, w, *b: x.conv2d(w, *b, **kwargs),
                     shapes, atol=CONV_ATOL, rtol=RTOL)

def test_conv2d_asymmetric_padding_unbatched_and_1d(compare_with_torch):
  compare_with_torch(lambda x, w: F.conv2d(F.pad(x, (1, 0, 2, 1)), w), lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)),
                     [(1, 2, 6, 6), (3, 2, 3, 3)], atol=CONV_ATOL)
  compare_with_torch(F.conv2d, Tensor.conv2d, [(2, 5, 5), (3, 2, 2, 2)], atol=CONV_ATOL)
  compare_with_torch(lambda x, w: F.conv1d(x, w, stride=2, padding=1), lambda x, w: x.conv2d(w, stride=2, padding=1),
                     [(2, 3, 9), (4, 3, 3)], atol=CONV_ATOL)

CONV_TRANSPOSE_CASES = [
  ("stride_padding_output_padding_groups", (2, 4, 5, 5), (4, 3, 3, 3),
   dict(bias=True, stride=2, padding=1, output_padding=1, groups=2)),
  ("dilation_asymmetric", (1, 2, 4, 3), (2, 3, 2, 3), dict(stride=(1, 2), padding=(0, 1), dilation=(2, 1))),
]

@pytest.mark.parametrize("name, x_shape, w_shape, kwargs", CONV_TRANSPOSE_CASES,
                         ids=[c[0] for c in CONV_TRANSPOSE_CASES])
def test_conv_transpose2d(compare_with_torch, name, x_shape, w_shape, kwargs):
  kwargs = dict(kwargs)
  shapes = [x_shape, w_shape] + ([(w_shape[1] * kwargs.get("groups", 1),)] if kwargs.pop("bias", False) else [])
  compare_with_torch(lambda x, w, *b: F.conv_transpose2d(x, w, *b, **kwargs),
                     lambda x, w, *b: x.conv_transpose2d(w, *b, **kwargs), shapes, atol=CONV_ATOL)

def test_conv_errors_like_torch():
  x, w = Tensor.ones(1, 4, 5, 5), Tensor.ones(8, 3, 3, 3)
  with pytest.raises(RuntimeError, match=r"expected input\[1, 4, 5, 5\] to have 3 channels, but got 4"): x.conv2d(w)
  with pytest.raises(RuntimeError, match="divisible by 2"):
    Tensor.ones(1, 4, 5, 5).conv2d(Tensor.ones(3, 2, 3, 3), groups=2)
  with pytest.raises(RuntimeError, match="Kernel size can't be greater"): Tensor.ones(1, 3, 2, 2).conv2d(w)
  with pytest.raises(RuntimeError, match="non-positive stride"): Tensor.ones(1, 3, 5, 5).conv2d(w, stride=0)
  with pytest.raises(RuntimeError, match="negative padding"):   # conv2d crops instead (tinygrad's)
    Tensor.ones(1, 3, 5, 5).conv_transpose2d(Tensor.ones(3, 8, 3, 3), padding=-1)
  with pytest.raises(RuntimeError, match="one dtype"): Tensor.ones(1, 3, 5, 5).half().conv2d(w)   # torch: no promotion
  with pytest.raises(RuntimeError, match="bias"): Tensor.ones(1, 3, 5, 5).conv2d(w, Tensor.ones(7))
  with pytest.raises(RuntimeError, match="strided"): Tensor.ones(1, 3, 5, 5).conv2d(w, stride=2, padding="same")
  with pytest.raises(RuntimeError, match=r"kernel_size|stride"): Tensor.ones(1, 3, 5, 5).conv2d(w, stride=(1, 1, 1))
  with pytest.raises(RuntimeError, match="4D"): Tensor.ones(5, 5).conv2d(w)
  with pytest.raises(RuntimeError, match="have 8 channels"): Tensor.ones(1, 3, 5, 5).conv_transpose2d(w)
  with pytest.raises(RuntimeError, match="output padding"):
    Tensor.ones(1, 8, 5, 5).conv_transpose2d(w, output_padding=1)

# ---------------------------------------------------------------------------------------------------------------
# pooling and resampling

POOL_CASES = [  # id, torch fn, tgrad fn, input shape, with gradient
  ("max_2x2", lambda x: F.max_pool2d(x, 2), lambda x: x.max_pool2d(2), (2, 3, 8, 7), True),
  ("max_overlapping_padded", lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: x.max_pool2d(3, 2, padding=1), (1, 2, 7, 7),
   True),
  ("max_ceil_dilation", lambda x: F.max_pool2d(x, 2, 2, 1, dilation=2, ceil_mode=True),
   lambda x: x.max_pool2d(2, 2, dilation=2, padding=1, ceil_mode=True), (1, 2, 8, 7), False),
  ("avg_padded", lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: x.avg_pool2d(3, 2, padding=1), (2, 2, 7, 6), True),
  ("avg_exclude_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
   lambda x: x.avg_pool2d(3, 2, padding=1, count_include_pad=False), (1, 2, 7, 7), True),
  ("avg_ceil", lambda x: F.avg_pool2d(x, (3, 2), 2, 1, ceil_mode=True),
   lambda x: x.avg_pool2d((3, 2), 2, padding=1, ceil_mode=True), (1, 2, 8, 7), False),
  ("avg_ceil_exclude_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
   lambda x: x.avg_pool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False), (1, 1, 8, 8), False),
  ("adaptive_avg_divisible", lambda x: F.adaptive_avg_pool2d(x, (4, 3)), lambda x: x.adaptive_avg_pool2d((4, 3)),
   (2, 3, 8, 6), True),
  ("adaptive_avg_uneven", lambda x: F.adaptive_avg_pool2d(x, (3, 2)), lambda x: x.adaptive_avg_pool2d((3, 2)),
   (2, 2, 7, 5), True),
  ("adaptive_max", lambda x: F.adaptive_max_pool2d(x, 2), lambda x: x.adaptive_max_pool2d(2), (2, 3, 8, 6), True),
  ("adaptive_avg_global", lambda x: F.adaptive_avg_pool2d(x, 1), lambda x: x.adaptive_avg_pool2d(1), (2, 3, 5, 5),
   True),
]

@pytest.mark.parametrize("name, torch_fn, tgrad_fn, shape, grad", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool(compare_with_torch, name, torch_fn, tgrad_fn, shape, grad):
  compare_with_torch(torch_fn, tgrad_fn, [shape], grad=grad)

def test_pool_errors_like_torch():
  with pytest.raises(RuntimeError, match="too small"): Tensor.ones(1, 2, 2).max_pool2d(3)
  with pytest.raises(RuntimeError, match="at most half"): Tensor.ones(1, 5, 5).max_pool2d(3, padding=2)
  with pytest.raises(RuntimeError, match="at most half"): Tensor.ones(1, 5, 5).avg_pool2d(3, padding=2)
  with pytest.raises(RuntimeError, match="stride"): Tensor.ones(1, 5, 5).max_pool2d(2, stride=0)

INTERPOLATE_CASES = [(mode, align, size) for mode, align in [("nearest", False), ("nearest-exact", False),
                                                            ("bilinear", False), ("bilinear", True)]
                     for size in [(9, 3), (2, 8)]]

@pytest.mark.parametrize("mode, align_corners, size", INTERPOLATE_CASES)
def test_interpolate(compare_with_torch, mode, align_corners, size):
  compare_with_torch(lambda x: F.interpolate(x, size=size, mode=mode, align_corners=align_corners if mode == "bilinear"
                                             else None),
                     lambda x: x.interpolate(size, mode=mode, align_corners=align_corners), [(1, 2, 5, 4)])

def test_interpolate_errors():
  with pytest.raises(ValueError, match="align_corners"): Tensor.ones(1, 1, 4, 4).interpolate((2, 2), "nearest", True)
  with pytest.raises(NotImplementedError, match="cubic"): Tensor.ones(1, 1, 4, 4).interpolate((2, 2), "bicubic")

# ---------------------------------------------------------------------------------------------------------------
# dropout, norms, attention

def test_dropout_train_and_eval():
  x = Tensor.ones(200, 100, requires_grad=True)
  assert x.dropout(0.3) is x   # Tensor.training is False: identity
  with Tensor.train():
    out = x.dropout(0.25)
    out.sum().backward()
    values = out.numpy()
  kept = values != 0
  assert abs(kept.mean() - 0.75) < 0.02
  np.testing.assert_allclose(values[kept], 1 / 0.75, rtol=1e-6)
  np.testing.assert_allclose(x.grad.numpy(), values, rtol=1e-6)    # the same mask scales the gradient
  with Tensor.train():
    assert x.dropout(1.0).numpy().max() == 0
  with pytest.raises(ValueError, match="between 0 and 1"): x.dropout(1.5)

def test_layernorm_rmsnorm_batchnorm_functional(compare_with_torch):
  compare_with_torch(lambda x: F.layer_norm(x, (4,), eps=1e-5), lambda x: x.layernorm(eps=1e-5), [(3, 5, 4)],
                     atol=1e-5, rtol=1e-4)
  compare_with_torch(lambda x: F.layer_norm(x, (5, 4)), lambda x: x.layernorm((-2, -1)), [(3, 5, 4)], atol=1e-5,
                     rtol=1e-4)
  compare_with_torch(lambda x: F.rms_norm(x, (4,), eps=1e-6), lambda x: x.rmsnorm(eps=1e-6), [(3, 4)], rtol=1e-4)
  mean, var = RNG.uniform(-1, 1, 3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
  compare_with_torch(lambda x, w, b: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, eps=1e-5),
                     lambda x, w, b: x.batchnorm(w, b, Tensor(mean), (Tensor(var) + 1e-5).rsqrt()),
                     [(2, 3, 4, 4), (3,), (3,)], atol=1e-5, rtol=1e-4)

ATTENTION_MASKS = {
  "none": lambda L, S: None,
  "bool": lambda L, S: np.tril(np.ones((L, S), bool), 1) | (np.arange(S) == 0),
  "additive": lambda L, S: RNG.uniform(-2, 0, (L, S)).astype(np.float32),
}

@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "causal"])
def test_scaled_dot_product_attention(compare_with_torch, mask_kind):
  L, S = 3, 5
  mask = None if mask_kind == "causal" else ATTENTION_MASKS[mask_kind](L, S)
  causal = mask_kind == "causal"
  compare_with_torch(
    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, None if mask is None else torch.tensor(mask),
                                                   is_causal=causal),
    lambda q, k, v: q.scaled_dot_product_attention(k, v, None if mask is None else Tensor(mask), is_causal=causal),
    [(2, 2, L, 4), (2, 2, S, 4), (2, 2, S, 6)], atol=1e-5, rtol=1e-4)

def test_attention_dropout_only_in_training_and_errors():
  q, k, v = Tensor.ones(1, 4, 8), Tensor.ones(1, 6, 8), Tensor.ones(1, 6, 8)
  np.testing.assert_allclose(q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy(), 1.0, rtol=1e-6)
  with Tensor.train():
    dropped = q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy()
  assert not np.allclose(dropped, 1.0)
  with pytest.raises(RuntimeError, match="is_causal"):
    q.scaled_dot_product_attention(k, v, Tensor.ones(4, 6, dtype=dtypes.bool), is_causal=True)
  with pytest.raises(RuntimeError, match="query"): q.scaled_dot_product_attention(Tensor.ones(1, 6, 7), v)

def test_tril_triu(compare_with_torch):
  compare_with_torch(lambda x: x.tril(), lambda x: x.tril(), [(2, 3, 4)])
  compare_with_torch(lambda x: x.triu(1), lambda x: x.triu(1), [(4, 3)])
  compare_with_torch(lambda x: x.tril(-1), lambda x: x.tril(-1), [(4, 4)])
  with pytest.raises(RuntimeError, match="2 dimensions"): Tensor.ones(3).tril()

# ---------------------------------------------------------------------------------------------------------------
# one_hot and losses

LABELS = np.array([2, 0, 3, 1, 2], np.int64)

def test_one_hot():
  got = Tensor(LABELS.astype(np.int32)).one_hot(5)
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), F.one_hot(torch.tensor(LABELS), 5).numpy())
  np.testing.assert_array_equal(Tensor([[1, 0]]).one_hot().numpy(), [[[0, 1], [1, 0]]])   # classes from the data
  with pytest.raises(RuntimeError, match="index"): Tensor([1.0]).one_hot(3)

CROSS_ENTROPY_CASES = [  # id, kwargs for both
  ("mean", dict()),
  ("sum_label_smoothing", dict(reduction="sum", label_smoothing=0.2)),
  ("none", dict(reduction="none")),
  ("ignore_index", dict(ignore_index=2)),
  ("ignore_index_smoothing", dict(ignore_index=0, label_smoothing=0.1)),
]

@pytest.mark.parametrize("name, kwargs", CROSS_ENTROPY_CASES, ids=[c[0] for c in CROSS_ENTROPY_CASES])
def test_cross_entropy_indices(compare_with_torch, name, kwargs):
  compare_with_torch(lambda x: F.cross_entropy(x, torch.tensor(LABELS), **kwargs),
                     lambda x: x.cross_entropy(Tensor(LABELS.astype(np.int32)), **kwargs), [(5, 4)], rtol=1e-5)

def test_cross_entropy_probabilities_and_spatial(compare_with_torch):
  probabilities = RNG.dirichlet(np.ones(4), 5).astype(np.float32)
  for kwargs in (dict(), dict(label_smoothing=0.3, reduction="sum")):
    compare_with_torch(lambda x: F.cross_entropy(x, torch.tensor(probabilities), **kwargs),
                       lambda x: x.cross_entropy(Tensor(probabilities), **kwargs), [(5, 4)])
  spatial = RNG.integers(0, 3, (2, 4, 5))
  compare_with_torch(lambda x: F.cross_entropy(x, torch.tensor(spatial)),
                     lambda x: x.cross_entropy(Tensor(spatial.astype(np.int32))), [(2, 3, 4, 5)])

def test_sparse_categorical_crossentropy(compare_with_torch):
  labels = np.array([[1, 0, 2], [2, -1, 0]])
  torch_labels = torch.tensor(np.where(labels == -1, -100, labels))
  compare_with_torch(lambda x: F.cross_entropy(x.permute(0, 2, 1), torch_labels, label_smoothing=0.1),
                     lambda x: x.sparse_categorical_crossentropy(Tensor(labels.astype(np.int32)), label_smoothing=0.1),
                     [(2, 3, 3)])

NLL_CASES = [  # id, kwargs for both (weight given as numpy, one per class)
  ("mean", dict()), ("sum", dict(reduction="sum")), ("none", dict(reduction="none")),
  ("weight_mean", dict(weight=np.array([0.5, 2.0, 1.0, 3.0], np.float32))),
  ("weight_ignore", dict(weight=np.array([0.5, 2.0, 1.0, 3.0], np.float32), ignore_index=1)),
]

@pytest.mark.parametrize("name, kwargs", NLL_CASES, ids=[c[0] for c in NLL_CASES])
def test_nll_loss(compare_with_torch, name, kwargs):
  spatial = RNG.integers(0, 4, (2, 3))
  for shape, labels in (((5, 4), LABELS), ((2, 4, 3), spatial)):
    torch_kwargs = {k: torch.tensor(v) if k == "weight" else v for k, v in kwargs.items()}
    tgrad_kwargs = {k: Tensor(v) if k == "weight" else v for k, v in kwargs.items()}
    compare_with_torch(lambda x: F.nll_loss(x.log_softmax(1), torch.tensor(labels), **torch_kwargs),
                       lambda x: x.log_softmax(1).nll_loss(Tensor(labels.astype(np.int32)), **tgrad_kwargs), [shape],
                       rtol=1e-5)
  with pytest.raises(RuntimeError, match="nll_loss: target of shape"): Tensor.ones(5, 4).nll_loss(Tensor([1, 2]))
  with pytest.raises(RuntimeError, match="weight of shape"): Tensor.ones(5, 4).nll_loss(Tensor(LABELS), Tensor.ones(3))

def test_binary_losses_and_mse(compare_with_torch):
  target = RNG.uniform(0, 1, (4, 3)).astype(np.float32)
  compare_with_torch(lambda p: F.binary_cross_entropy(p, torch.tensor(target)),
                     lambda p: p.binary_crossentropy(Tensor(target)), [(4, 3)], low=0.05, high=0.95)
  pos_weight = np.array([0.5, 2.0, 1.0], np.float32)
  for kwargs in (dict(), dict(reduction="sum")):
    compare_with_torch(lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(target), **kwargs),
                       lambda x: x.binary_crossentropy_logits(Tensor(target), **kwargs), [(4, 3)], low=-30, high=30)
  compare_with_torch(lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(target),
                                                                  pos_weight=torch.tensor(pos_weight)),
                     lambda x: x.binary_crossentropy_logits(Tensor(target), pos_weight=Tensor(pos_weight)), [(4, 3)])
  compare_with_torch(F.mse_loss, lambda a, b: (a - b).square().mean(), [(4, 3), (4, 3)])

def test_loss_errors_like_torch():
  logits = Tensor.ones(3, 4)
  with pytest.raises(ValueError, match=r"batch_size \(3\) to match target batch_size \(4\)"):
    logits.cross_entropy(Tensor([1, 2, 3, 0]))
  with pytest.raises(RuntimeError, match="label_smoothing"):
    logits.cross_entropy(Tensor([1, 2, 3]), label_smoothing=1.5)
  with pytest.raises(RuntimeError, match="int"): logits.cross_entropy(Tensor([1.0, 2.0, 3.0]))
  with pytest.raises(RuntimeError, match=r"\(3, 5\)"): logits.cross_entropy(Tensor.ones(3, 5))
  with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
    logits.cross_entropy(Tensor([1, 2, 3]), reduction="avg")
  with pytest.raises(ValueError, match="same as input size"): Tensor.ones(3).binary_crossentropy_logits(Tensor.ones(4))
  with pytest.raises(RuntimeError, match=r"\(3,\)"): logits.sparse_categorical_crossentropy(Tensor([1, 2]))

# ---------------------------------------------------------------------------------------------------------------
# gather and scatter

INDEX = np.array([[2, 0, 1], [1, 1, 0]])

def test_gather(compare_with_torch):
  compare_with_torch(lambda x: x.gather(1, torch.tensor(INDEX)), lambda x: x.gather(1, Tensor(INDEX)), [(2, 4)])
  compare_with_torch(lambda x: x.gather(0, torch.tensor(INDEX[:, :2] % 2)),
                     lambda x: x.gather(0, Tensor(INDEX[:, :2] % 2)), [(3, 4)])   # index smaller than x elsewhere
  compare_with_torch(lambda x: x.gather(-1, torch.tensor(INDEX[None])), lambda x: x.gather(-1, Tensor(INDEX[None])),
                     [(1, 2, 3)])

SCATTER_INDEX = np.array([[0, 3, 1], [2, 0, 3]])   # unique per row: torch leaves the order of repeats undefined

@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter(compare_with_torch, reduce):
  kwargs = {} if reduce is None else dict(reduce=reduce)
  def torch_scatter(x, s):   # torch differentiates scatter_add, not scatter(reduce="add")
    index = torch.tensor(SCATTER_INDEX)
    if reduce == "add": return x.scatter_add(1, index, s)
    return x.scatter_reduce(1, index, s, "prod") if reduce == "multiply" else x.scatter(1, index, s)
  compare_with_torch(torch_scatter,
                     lambda x, s: x.scatter(1, Tensor(SCATTER_INDEX), s, **kwargs), [(3, 5), (2, 3)])
  compare_with_torch(torch_scatter,   # src bigger than index
                     lambda x, s: x.scatter(1, Tensor(SCATTER_INDEX), s, **kwargs), [(3, 5), (3, 4)], grad=False)

def test_scatter_scalar_repeats_and_errors():
  x = Tensor.zeros(2, 4)
  np.testing.assert_array_equal(x.scatter(1, Tensor([[1, 1], [3, 0]]), 7.0).numpy(), [[0, 7, 0, 0], [7, 0, 0, 7]])
  repeated = Tensor.zeros(1, 3).scatter(1, Tensor([[2, 2, 0]]), Tensor([[1.0, 2.0, 3.0]]))
  assert repeated.tolist() == [[3.0, 0.0, 2.0]]    # the last write to a position wins
  added = Tensor.zeros(1, 3).scatter(1, Tensor([[2, 2, 0]]), Tensor([[1.0, 2.0, 3.0]]), reduce="add")
  assert added.tolist() == [[3.0, 0.0, 3.0]]
  with pytest.raises(RuntimeError, match="same number of dimensions"): x.gather(1, Tensor([1, 2]))
  with pytest.raises(RuntimeError, match="no larger than self"): x.gather(0, Tensor([[0, 0, 0, 0, 0]]))
  with pytest.raises(RuntimeError, match="int index"): x.gather(1, Tensor([[1.0]]))
  with pytest.raises(RuntimeError, match="add or multiply"): x.scatter(1, Tensor([[1]]), 1.0, reduce="max")

# ---------------------------------------------------------------------------------------------------------------
# layers

def _layer_pair(torch_module, tgrad_layer):
  """Load the torch module's state into the tgrad layer (names must match); its parameters then require grad."""
  load_state_dict(tgrad_layer, {k: Tensor(v.detach().numpy()) for k, v in torch_module.state_dict().items()})
  for t in get_parameters(tgrad_layer):
    if t.requires_grad is None: t.requires_grad = True
  return torch_module, tgrad_layer

def _compare_layer(torch_module, tgrad_layer, x: np.ndarray, atol=1e-5, rtol=1e-4):
  """Outputs, and the gradients of the input and of every parameter, of a randomly weighted sum of the outputs."""
  torch_x, tgrad_x = torch.tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
  want, got = torch_module(torch_x), tgrad_layer(tgrad_x)
  np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=atol, rtol=rtol)
  weights = RNG.uniform(0.5, 1.5, tuple(want.shape)).astype(np.float32)
  (want * torch.tensor(weights)).sum().backward()
  (got * Tensor(weights)).sum().backward()
  np.testing.assert_allclose(tgrad_x.grad.numpy(), torch_x.grad.numpy(), atol=10 * atol, rtol=10 * rtol)
  torch_params = dict(torch_module.named_parameters())
  for name, t in get_state_dict(tgrad_layer).items():
    if name in torch_params:
      np.testing.assert_allclose(t.grad.numpy(), torch_params[name].grad.numpy(), atol=10 * atol, rtol=10 * rtol,
                                 err_msg=name)

LAYER_CASES = [  # id, torch module, tgrad layer, input shape
  ("linear", lambda: torch.nn.Linear(5, 3), lambda: nn.Linear(5, 3), (4, 5)),
  ("linear_no_bias", lambda: torch.nn.Linear(5, 3, bias=False), lambda: nn.Linear(5, 3, bias=False), (2, 4, 5)),
  ("conv2d", lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
   lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 6, 6)),
  ("conv_transpose2d", lambda: torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
   lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (1, 3, 4, 4)),
  ("layernorm", lambda: torch.nn.LayerNorm((3, 4)), lambda: nn.LayerNorm((3, 4)), (2, 3, 4)),
  ("rmsnorm", lambda: torch.nn.RMSNorm(4, eps=1e-6), lambda: nn.RMSNorm(4), (2, 3, 4)),
  ("groupnorm", lambda: torch.nn.GroupNorm(2, 4), lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
]

@pytest.mark.parametrize("name, torch_factory, tgrad_factory, shape", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_matches_torch(name, torch_factory, tgrad_factory, shape):
  torch.manual_seed(0)
  torch_module, layer = _layer_pair(torch_factory(), tgrad_factory())
  with torch.no_grad():   # non-trivial affine parameters, so their gradients are tested too
    for p in torch_module.parameters(): p.add_(torch.rand_like(p) * 0.5)
  torch_module, layer = _layer_pair(torch_module, layer)
  assert list(get_state_dict(layer)) == list(torch_module.state_dict())
  _compare_layer(torch_module, layer, RNG.uniform(-2, 2, shape).astype(np.float32))

def test_embedding_matches_torch():
  torch_module, layer = _layer_pair(torch.nn.Embedding(7, 3), nn.Embedding(7, 3))
  indices = np.array([[1, 6, 1], [0, 2, 5]])
  want, got = torch_module(torch.tensor(indices)), layer(Tensor(indices.astype(np.int32)))
  np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6)
  want.sum().backward()
  got.sum().backward()
  np.testing.assert_allclose(layer.weight.grad.numpy(), torch_module.weight.grad.numpy())
  with pytest.raises(RuntimeError, match="int"): layer(Tensor([0.5]))

def test_batchnorm_training_updates_running_stats_and_eval_uses_them():
  torch_module, layer = _layer_pair(torch.nn.BatchNorm2d(3, momentum=0.2), nn.BatchNorm2d(3, momentum=0.2))
  for step in range(2):
    x = RNG.uniform(-2, 3, (4, 3, 2, 2)).astype(np.float32)
    torch_module.train()
    with Tensor.train():
      _compare_layer(torch_module, layer, x)
    Tensor.realize(layer.running_mean, layer.running_var, layer.num_batches_tracked)
    for name in ("running_mean", "running_var"):
      np.testing.assert_allclose(getattr(layer, name).numpy(), getattr(torch_module, name).numpy(), rtol=1e-5,
                                 atol=1e-6, err_msg=f"{name} after step {step}")
  assert layer.num_batches_tracked.item() == 2
  torch_module.eval()
  _compare_layer(torch_module, layer, RNG.uniform(-2, 2, (2, 3, 2, 2)).astype(np.float32))

def test_batchnorm_cumulative_average_and_no_running_stats():
  torch_module, layer = _layer_pair(torch.nn.BatchNorm1d(2, momentum=None), nn.BatchNorm(2, momentum=None))
  torch_module.train()
  with Tensor.train():
    for _ in range(3): _compare_layer(torch_module, layer, RNG.uniform(-1, 1, (5, 2)).astype(np.float32))
  np.testing.assert_allclose(layer.running_var.numpy(), torch_module.running_var.numpy(), rtol=1e-5)
  plain, torch_plain = nn.BatchNorm(2, affine=False, track_running_stats=False), torch.nn.BatchNorm1d(
    2, affine=False, track_running_stats=False).eval()
  assert get_state_dict(plain) == {}
  _compare_layer(torch_plain, plain, RNG.uniform(-1, 1, (5, 2)).astype(np.float32))   # eval: batch statistics
  with Tensor.train(), pytest.raises(ValueError, match="more than 1 value"): layer(Tensor.ones(1, 2))
  with pytest.raises(RuntimeError, match="2 channels"): layer(Tensor.ones(4, 3))

def test_initialization_like_torch():
  Tensor.manual_seed(1)
  linear = nn.Linear(400, 300)
  bound = 1 / math.sqrt(400)
  weights = linear.weight.numpy()
  assert weights.shape == (300, 400) and np.abs(weights).max() <= bound
  assert abs(weights.std() - bound / math.sqrt(3)) < 0.01 * bound   # uniform(−b, b) has std b/√3
  assert np.abs(linear.bias.numpy()).max() <= bound
  conv = nn.Conv2d(8, 16, 3, groups=2)
  conv_bound = 1 / math.sqrt(4 * 9)
  assert conv.weight.shape == (16, 4, 3, 3) and np.abs(conv.weight.numpy()).max() <= conv_bound
  assert abs(nn.Embedding(100, 50).weight.numpy().std() - 1) < 0.05
  norm = nn.LayerNorm(3)
  assert norm.weight.tolist() == [1, 1, 1] and norm.bias.tolist() == [0, 0, 0]

def test_state_dict_and_parameters_of_a_nested_model():
  class Block:
    def __init__(self):
      self.conv, self.norm = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)
  class Model:
    def __init__(self):
      self.blocks = [Block(), Block()]
      self.heads = {"out": nn.Linear(2, 3)}
      self.scale = 2.0
  model = Model()
  state = get_state_dict(model)
  assert list(state) == [f"blocks.{i}.{name}" for i in range(2) for name in
                         ("conv.weight", "conv.bias", "norm.weight", "norm.bias", "norm.running_mean",
                          "norm.running_var", "norm.num_batches_tracked")] + ["heads.out.weight", "heads.out.bias"]
  assert state["blocks.1.norm.num_batches_tracked"].dtype == dtypes.int64
  parameters = get_parameters(model)
  assert len(parameters) == len(state) and parameters[0] is model.blocks[0].conv.weight

def test_sequential():
  layers = [nn.Linear(3, 4), Tensor.relu, nn.Linear(4, 2)]
  x = Tensor.ones(2, 3)
  np.testing.assert_allclose(x.sequential(layers).numpy(), layers[2](layers[0](x).relu()).numpy(), rtol=1e-6)
