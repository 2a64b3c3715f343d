"""lazy.py owns the lazy graph: no other module of tgrad assigns a LazyBuffer's op, srcs, arg, buffer, region or base
(they go through LazyBuffer.rewrite, commit, with_sources and set_region), and the one walk is lazy.walk."""
import ast, pathlib
import pytest
from tgrad import Tensor
from tgrad.lazy import walk, unrealized_bases

TGRAD = pathlib.Path(__file__).resolve().parents[2] / "tgrad"
OWNED_FIELDS = {"op", "srcs", "arg", "buffer", "region", "_base", "_built"}
# objects of other classes that have a field of one of those names, as named where they are assigned
NOT_LAZYBUFFERS = {("jit.py", "slot"), ("jit.py", "self.slots[s]"), ("jit.py", "slots[s]")}

def _assigned_fields(tree: ast.AST):
  """(line, object expression, field) for every assignment to an attribute named in OWNED_FIELDS, outside `self`."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for target in targets:
        for part in (target.elts if isinstance(target, ast.Tuple) else [target]):
          if isinstance(part, ast.Attribute) and part.attr in OWNED_FIELDS:
            owner = ast.unparse(part.value)
            if owner != "self": yield node.lineno, owner, part.attr
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
         len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in OWNED_FIELDS:
      yield node.lineno, ast.unparse(node.args[0]), node.args[1].value

def test_no_module_but_lazy_assigns_a_lazybuffers_fields():
  offenders = []
  for path in sorted(TGRAD.rglob("*.py")):
    if path.name == "lazy.py" and path.parent == TGRAD: continue
    for line, owner, field in _assigned_fields(ast.parse(path.read_text())):
      if (path.name, owner) not in NOT_LAZYBUFFERS:
        offenders.append(f"{path.relative_to(TGRAD)}:{line} {owner}.{field}")
  assert not offenders, f"only tgrad/lazy.py may change a LazyBuffer's graph fields: {offenders}"

def test_the_check_finds_an_assignment():
  found = list(_assigned_fields(ast.parse("root.op, root.srcs = a, b\nx.buffer = y\nsetattr(lb, 'region', None)")))
  assert [(owner, field) for _, owner, field in found] == [("root", "op"), ("root", "srcs"), ("x", "buffer"),
                                                           ("lb", "region")]

def _graph():
  x, y = Tensor.rand(3, 4).realize(), Tensor.rand(4)
  return ((x * 2 + y).exp().sum(1, keepdim=True) + x.max(1, keepdim=True)).lazydata, x.lazydata

def _reads(n):
  return [n.base] if not n.is_base else list(n.srcs if n.buffer is None else ())

def test_walk_pre_order_visits_each_node_once_after_a_node_that_reads_it():
  out, x = _graph()
  nodes = list(walk([out]))
  assert len({id(n) for n in nodes}) == len(nodes) and nodes[0] is out
  for i, n in enumerate(nodes[1:], 1):   # depth-first pre-order: first reached from a node walked before it
    assert any(any(r is n for r in _reads(m)) for m in nodes[:i])
  assert all(any(r is m for m in nodes) for n in nodes for r in _reads(n))   # every node above out
  assert x.base in nodes and not any(n.srcs for n in nodes if n.is_base and n.buffer is not None)

def test_walk_post_order_puts_sources_first_and_options_filter():
  out, x = _graph()
  nodes = list(walk([out], "post"))
  position = {id(n): i for i, n in enumerate(nodes)}
  assert all(position[id(r)] < position[id(n)] for n in nodes for r in _reads(n))
  bases = list(walk([out], "post", views=False, realized=False))
  assert bases == unrealized_bases([out]) and all(b.is_base and b.buffer is None for b in bases)
  assert x.base not in bases and x.base in list(walk([out], views=False))
  below_stop = list(walk([out], stop=lambda n: n is out.srcs[0]))
  assert out.srcs[0] not in below_stop and out in below_stop
  with pytest.raises(ValueError): walk([out], "sideways")

def test_rewrite_keeps_the_graph_as_built_and_commit_forgets_it():
  a = Tensor.rand(5).realize()
  value = (a * 3).lazydata
  built = (value.op, value.srcs, value.arg)
  other = (a + 1).lazydata
  value.rewrite(other.op, other.srcs, other.arg)
  assert value.as_built == built and value.op is other.op
  value.rewrite(*value.as_built)
  assert (value.op, value.srcs, value.arg) == built
  value.rewrite(other.op, other.srcs, other.arg, keep_built=False)
  assert value.as_built == (other.op, other.srcs, other.arg)
  with pytest.raises(ValueError): a.lazydata.rewrite(*built)   # realized
  np_value = Tensor(value).numpy()
  assert abs(np_value - (a.numpy() + 1)).max() < 1e-6
