"""Argument errors of Tensor ops that used to pass silently: float pad/shrink amounts (truncated before) raise
TypeError naming the argument; multinomial weights that are negative, inf, nan or a row of zeros raise ValueError."""
import math
import numpy as np
import pytest
from tgrad import Tensor

@pytest.mark.parametrize("call, argument", [
  (lambda t: t.pad(((0, 1.5), None)), "padding"), (lambda t: t.pad((1.0, 2)), "padding"),
  (lambda t: t.pad((1, 2, True, 0)), "padding"), (lambda t: t.pad((0.5, 1), mode="reflect"), "padding"),
  (lambda t: t.shrink(((0, 2.0), None)), "shrink bounds"), (lambda t: t.shrink(((np.float32(1), 3), None)),
                                                             "shrink bounds")])
def test_float_amounts_raise_type_error_naming_the_argument(call, argument):
  with pytest.raises(TypeError, match=rf"^{argument} must hold ints, got .*\((float|bool|float32)\)"):
    call(Tensor.ones(3, 4))

def test_int_amounts_still_work():
  t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  assert t.pad((1, 2)).shape == (3, 7) and t.pad(((np.int64(1), 0), None)).shape == (4, 4) and t.pad(()) is t
  np.testing.assert_array_equal(t.shrink(((1, np.int32(3)), None)).numpy(), np.arange(4, 12).reshape(2, 4))
  with pytest.raises(ValueError, match=r"padding: each entry must be a \(start, end\) pair"): t.pad(((1,), None))

@pytest.mark.parametrize("weights, message", [
  ([0.0, 0.0, 0.0], "sums to 0"), ([[1.0, 2.0], [0.0, 0.0]], "sums to 0"), ([1.0, -1.0, 2.0], "negative, inf or nan"),
  ([1.0, math.nan], "negative, inf or nan"), ([1.0, math.inf], "negative, inf or nan"),
  ([[2.0, 1.0], [-0.5, 3.0]], "negative, inf or nan")])
def test_multinomial_rejects_what_torch_rejects(weights, message):
  with pytest.raises(ValueError, match=rf"multinomial: .*{message}"): Tensor(weights).multinomial(1, replacement=True)

def test_multinomial_valid_weights_still_sample():
  Tensor.manual_seed(0)
  drawn = Tensor([[0.0, 0.0, 5.0], [1.0, 0.0, 0.0]]).multinomial(8, replacement=True).numpy()
  assert (drawn[0] == 2).all() and (drawn[1] == 0).all()

def test_tensor_constructor_errors_name_the_argument():
  from tgrad import Tensor
  with pytest.raises(TypeError, match="device must be a str"): Tensor([1.0], device=123)
  with pytest.raises(ValueError, match="more than any device can index"): Tensor.empty(2**64)
  with pytest.raises(TypeError, match="mixing Tensors"): Tensor([Tensor(1.0), 2.0])
  with pytest.raises(ValueError, match="different shapes"): Tensor([Tensor([1.0]), Tensor([1.0, 2.0])])

def test_a_list_of_tensors_makes_a_tensor_as_in_torch():
  from tgrad import Tensor
  assert Tensor([Tensor(1.0), Tensor(2.0)]).tolist() == [1.0, 2.0]
  source = Tensor([[1, 2], [3, 4]])
  made = Tensor([source[0], source[1]], dtype="float32")
  assert made.tolist() == [[1.0, 2.0], [3.0, 4.0]] and made.dtype.name == "float32"
  source[0, 0] = 9   # a copy: writes into the source don't reach it
  assert made.tolist() == [[1.0, 2.0], [3.0, 4.0]]
