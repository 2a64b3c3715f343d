"""test/fuzz_ops.py must keep working: a few dozen seeded cases run in CI (the full run is a separate command), the
generator is deterministic per (seed, case), and the comparison notices a wrong answer and prints a replayable case.
"""
import numpy as np
import fuzz_ops
from fuzz_ops import Value

SMOKE_SEED = 0
SMOKE_CASES = 30

def test_smoke_cases_pass_and_cover_every_category():
  categories = set()
  for index in range(SMOKE_CASES):
    case, failure = fuzz_ops.run_case(SMOKE_SEED, index, "LLVM")
    assert failure is None, fuzz_ops.snippet(case, failure, "LLVM")
    categories |= {line.category for line in case.lines}
  missing = set(fuzz_ops.CATEGORY_WEIGHTS) - categories
  assert not missing, f"categories never drawn in {SMOKE_CASES} cases: {missing}"

def test_cases_are_deterministic_per_seed_and_index():
  first, again, other = fuzz_ops.build_case(7, 3), fuzz_ops.build_case(7, 3), fuzz_ops.build_case(8, 3)
  assert [line.tgrad for line in first.lines] == [line.tgrad for line in again.lines]
  assert [line.tgrad for line in first.lines] != [line.tgrad for line in other.lines]
  data = fuzz_ops.run_reference(first.lines)
  assert all(np.array_equal(data[k], fuzz_ops.run_reference(again.lines)[k], equal_nan=True) for k in first.outputs)

def test_compare_catches_wrong_values_dtypes_and_shapes():
  exact = Value("v1", (3,), "float32", 4.0, 0.0, 3)
  want = np.array([0.5, -1.0, 2.0], np.float32)
  assert fuzz_ops.compare(exact, "float32", want.copy(), want) is None
  assert fuzz_ops.compare(exact, "float32", want + np.float32(2.0 ** -20), want)[0] == "value"   # exact: no slack
  assert fuzz_ops.compare(exact, "float16", want.astype(np.float16), want)[0] == "dtype"
  assert fuzz_ops.compare(exact, "float32", want[:2], want)[0] == "shape"
  rounded = Value("v1", (3,), "float32", 4.0, 1e-6)
  assert fuzz_ops.compare(rounded, "float32", want + np.float32(1e-6), want) is None
  assert fuzz_ops.compare(rounded, "float32", want + np.float32(1e-3), want)[0] == "value"
  nan = np.array([np.nan, np.inf], np.float32)
  assert fuzz_ops.compare(Value("v1", (2,), "float32", 1.0, 0.0, terminal=True), "float32", nan.copy(), nan) is None
  ints = Value("v2", (2,), "int8", 127)
  assert fuzz_ops.compare(ints, "int8", np.array([1, 2], np.int8), np.array([1, 3], np.int8))[0] == "value"

def test_a_failure_prints_as_replayable_tgrad_code():
  index, case = next((i, c) for i, c in ((i, fuzz_ops.build_case(SMOKE_SEED, i)) for i in range(SMOKE_CASES))
                     if c.values[c.outputs[0]].numel and c.values[c.outputs[0]].dtype in ("float32", "int32"))
  last = case.lines[-1]
  broken = fuzz_ops.Line(last.name, last.category, last.tgrad, f"({last.mirror}) + 1", last.inputs)  # a wrong mirror
  failure = fuzz_ops.check(case, case.lines[:-1] + [broken], [last.name], "LLVM")
  assert failure is not None and failure.kind == "value"
  failure.lines = fuzz_ops._closure(case, [last.name])
  text = fuzz_ops.snippet(case, failure, "LLVM")
  assert f"--seed {SMOKE_SEED} --case {index}" in text and f"{last.name} = {last.tgrad}" in text
  namespace: dict = {}
  exec(text.replace(f"print({last.name}.numpy())", f"result = {last.name}.numpy()"), namespace)   # it runs as printed
  assert namespace["result"].shape == case.values[last.name].shape
