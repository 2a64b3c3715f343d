"""The schedule cache: a lazy graph with the same structure as one scheduled before reuses that schedule.

Scheduling is a pure function of a graph's structure: its ops, dtypes, args, shapes, views, devices and edges,
which values are already realized (and which of those share a Buffer), and which values are asked for. A training
loop or a decode loop builds the same structure every step, around new Buffers and new host data. So
`schedule(outs)` first computes that structure as a key (one walk over the unrealized part of the graph); on a hit
it rebuilds the ScheduleItems from the stored template — new Buffers where the template made new ones, this graph's
realized Buffers and host arrays where the template read them — and commits them to the graph exactly as
`create_schedule(outs, commit=True)` does. On a miss it calls the scheduler and stores a template of the result.
Templates hold no LazyBuffer and no Buffer, only positions in the walk. A lifted Python scalar (tgrad/scalars.py) is
keyed without its value: its kernel takes it as a parameter, read from the constant at its position on every hit.

`schedule` is `look_up` (the walk, its key and the stored template) then `schedule_found` (the ScheduleItems). The
eager realize (tgrad/realize.py) uses the two halves itself: on a hit whose template it has lowered before (the
template's `plan` slot, which this module only carries), it takes the Buffers and commits from `bind` and launches
the plan, with no ScheduleItem built.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional
from tgrad.device import Buffer
from tgrad.dtype import DType
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import CollectiveGroup, Ops, UOp, SymbolicState
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import unbind
from tgrad.scalars import param_name
from tgrad.helpers import current_settings
from tgrad.schedule import (MAX_SCALAR_PARAMS, NO_VARIABLES, ScheduleItem, create_schedule, keep_old_values,
                            scalar_values, with_collective_siblings)

# Templates are kept for this many graph nodes in all (oldest dropped first): a key holds one entry per node, so
# this bounds the cache's memory (about 100 bytes a node) whatever graphs a program builds.
MAX_CACHED_NODES = 1_000_000

# The one-op walk (an op over realized values and constants) finds repeated nodes by scanning lists: quadratic in
# the number of sources, so ops with more than this many take the general walk (elementwise ops have at most 3).
ONE_OP_MAX_SOURCES = 8

_LEAF = "realized"
_VIEW = "view"
_LIFTED = "lifted scalar"   # the arg key of a lifted constant: its value is a kernel parameter, not structure

class TemplateItem(NamedTuple):
  """One ScheduleItem of a template, over positions."""
  ast: UOp
  buffers: tuple[int, ...]      # indices into the template's Buffer list (outputs first)
  outputs: int
  host_node: Optional[int]      # the position of the node whose host data a copy item reads
  variables: tuple[str, ...]    # names of the symbolic variables its kernel reads
  scalars: tuple[int, ...]      # node positions of its scalar parameters' constants, in parameter order

@dataclass(eq=False)
class Template:
  """A schedule over positions. A Buffer is named by its index in one list: the graph's distinct realized Buffers
  (numbered by the walk; every graph with this key has the same number of them) followed by the new Buffers."""
  items: tuple[TemplateItem, ...]
  new_buffers: tuple[tuple[str, int, DType, Any], ...]     # (device, size, dtype, symbolic size) of each new Buffer
  commits: tuple[tuple[int, int, bool], ...]               # (node position, buffer index, keeps its arg): the
  nodes: int                                               # values the schedule realizes
  # (settings, launches) of the layer that runs schedules (tgrad/realize.py): what it lowered this schedule to under
  # those settings (launches None: it can't be run without ScheduleItems). Carried here, never read here.
  plan: Optional[tuple] = None

_templates: dict[tuple, Template] = {}
_cached_nodes = 0

class _Walk:
  """The unrealized graph above `outs`: every node (views included) numbered in depth-first pre-order from the roots,
  its structural entry (children named by their numbers), and the realized Buffers it reads, numbered by first
  appearance. Any numbering fixed by the structure alone works: equal keys mean isomorphic graphs. With symbolic
  shapes the key holds the variables, and `var_vals` their values. `_Walk(roots)` is the general walk; `_one_op_walk`
  gives the same for one op over values that need no computing (`look_up` takes it where it can)."""
  var_vals: dict[str, int] = {}   # only set (on the instance) when a variable was ever bound
  def __init__(self, roots: list[LazyBuffer]):
    self.roots = roots
    nodes: list[LazyBuffer] = list(walk(roots))
    position: dict[int, int] = {id(lb): p for p, lb in enumerate(nodes)}
    entries: list[tuple] = []
    unrealized: list[int] = []   # positions of the unrealized bases: the values a schedule may realize
    leaf_buffers: list[Buffer] = []
    leaf_number: dict[int, int] = {}
    # past MAX_SCALAR_PARAMS lifted constants a kernel may bake some as literals: then the values are structure
    lift = sum(1 for lb in nodes if lb.lifted) <= MAX_SCALAR_PARAMS
    for p, lb in enumerate(nodes):
      if lb._base is not None: entries.append((_VIEW, lb.st, position[id(lb._base)]))
      elif (buffer := lb.buffer) is not None:
        if (number := leaf_number.get(id(buffer))) is None:
          number = leaf_number[id(buffer)] = len(leaf_buffers)
          leaf_buffers.append(buffer)
        entries.append((_LEAF, lb.device, lb.dtype.key, lb.shape, number))
      else:
        arg = _LIFTED if lb.lifted and lift else lb.arg
        entries.append((lb.op, lb.device, lb.dtype.key, lb.shape, arg if arg is None else _arg_key(arg),
                        tuple([position[id(s)] for s in lb.srcs])))
        unrealized.append(p)
    self.nodes, self.unrealized, self.leaf_buffers = nodes, unrealized, leaf_buffers
    if SymbolicState.bound: entries, self.var_vals = _unbound_entries(entries)
    self.key = (tuple(entries), tuple([position[id(lb)] for lb in roots]))

def _one_op_walk(root: LazyBuffer) -> Optional[_Walk]:
  """The walk of one op over sources that need no computing (an eager op on realized tensors and constants; see
  `_is_one_op`, which it checks as it goes: None where the root is not one): the same nodes, numbers and key as the
  general walk gives, without its stack and dicts. Nodes are found again by identity in short lists (`in` and
  `index` compare by identity: neither LazyBuffer nor Buffer defines equality)."""
  srcs = root.srcs
  if len(srcs) > ONE_OP_MAX_SOURCES: return None
  nodes: list[LazyBuffer] = [root]
  entries: list[Any] = [None]   # the root's is made last: it names its sources' positions
  positions: list[int] = []     # of the root's sources
  unrealized: list[int] = [0]
  leaf_buffers: list[Buffer] = []
  for lb in srcs:   # pre-order from the root: each source, then (a view's) its base; seen ones keep their number
    if lb in nodes:
      positions.append(nodes.index(lb))
      continue
    base = lb._base
    node = lb if base is None else base   # the base this source reads: realized, or an op without sources
    if node.buffer is None and node.srcs: return None
    positions.append(len(nodes))
    nodes.append(lb)
    if base is not None:
      if base in nodes:
        entries.append((_VIEW, lb.st, nodes.index(base)))
        continue
      entries.append((_VIEW, lb.st, len(nodes)))
      nodes.append(base)
    if (buffer := node.buffer) is not None:
      if buffer in leaf_buffers: number = leaf_buffers.index(buffer)
      else:
        number = len(leaf_buffers)
        leaf_buffers.append(buffer)
      entries.append((_LEAF, node.device, node.dtype.key, node.shape, number))
    else:   # a sourceless op (a constant, host data, an empty buffer)
      arg = _LIFTED if node.lifted else node.arg
      entries.append((node.op, node.device, node.dtype.key, node.shape, arg if arg is None else _arg_key(arg), ()))
      unrealized.append(len(nodes) - 1)
  arg = _LIFTED if root.lifted else root.arg
  entries[0] = (root.op, root.device, root.dtype.key, root.shape, arg if arg is None else _arg_key(arg),
                tuple(positions))
  found = _Walk.__new__(_Walk)
  found.roots, found.nodes, found.unrealized, found.leaf_buffers = [root], nodes, unrealized, leaf_buffers
  if SymbolicState.bound: entries, found.var_vals = _unbound_entries(entries)
  found.key = (tuple(entries), (0,))
  return found

# ---- the eager key: one op over realized values and constants, keyed without a walk
# An eager op's graph is one unrealized base over sources that need no computing. `eager_key` names its structure in
# one flat tuple, with everything its walk key holds (so equal eager keys mean equal walk keys, hence one template),
# and `eager_launches` keeps under it what the layer that runs schedules made of that template's plan (tgrad/realize.py:
# the launch of its one kernel; carried here, never read here): the eager realize goes from the op straight to its
# launch, with no walk, no walk key and no ScheduleItem. Only graphs without symbolic shapes or variables are kept
# under an eager key (the walk key holds bare variables, this key bound ones).
MAX_EAGER_KEYS = 4096   # eager keys kept (all forgotten when full): one per distinct op structure a program runs
eager_launches: dict[tuple, Any] = {}   # read by the eager realize; written by `remember_eager` only
_EAGER_VIEW = -1   # in an eager key, before a view's (tracker, base) pair: the ints of a key are node numbers
_EAGER_EXCLUDED = (Ops.ASSIGN, Ops.COLLECTIVE)   # writes (old values may need keeping) and multi-device steps

def eager_key(root: LazyBuffer, riders: int) -> Optional[tuple[tuple, list[LazyBuffer], list[Buffer]]]:
  """(key, nodes, leaf Buffers) of an unrealized base `root` whose sources are realized bases, views of them, or
  views of sourceless constants; None for any other graph. Nodes are numbered as the one-op walk numbers them (so a
  template's node positions index `nodes`) and leaf Buffers by first appearance. The key: riders, the root's op,
  dtype, device, shape and arg, then per source the number of the node it repeats, or its entry: a realized base's
  (dtype, shape, device, Buffer number); a view's marker, tracker and base number, then its base's entry if new; a
  constant's (op, dtype, shape, device, arg or the lifted marker)."""
  srcs = root.srcs
  if len(srcs) > ONE_OP_MAX_SOURCES or root.op in _EAGER_EXCLUDED: return None
  arg = root.arg
  key: list[Any] = [riders, root.op, root.dtype.key, root.device, root.shape,
                    _LIFTED if root.lifted else arg if arg is None else _arg_key(arg)]
  nodes: list[LazyBuffer] = [root]
  leaf_buffers: list[Buffer] = []
  for lb in srcs:
    if lb in nodes:   # `in` and `index` compare by identity (LazyBuffer defines no equality)
      key.append(nodes.index(lb))
      continue
    nodes.append(lb)
    node = lb
    if (base := lb._base) is not None:
      if base in nodes:
        key += (_EAGER_VIEW, lb.st, nodes.index(base))
        continue
      key += (_EAGER_VIEW, lb.st, len(nodes))
      nodes.append(base)
      node = base
    if (buffer := node.buffer) is not None:
      if buffer in leaf_buffers: number = leaf_buffers.index(buffer)
      else:
        number = len(leaf_buffers)
        leaf_buffers.append(buffer)
      key.append((node.dtype.key, node.shape, node.device, number))
    elif node.op is Ops.CONST and not node.srcs and node._base is None:
      arg = node.arg
      key.append((Ops.CONST, node.dtype.key, node.shape, node.device,
                  _LIFTED if node.lifted else arg if arg is None else _arg_key(arg)))
    else: return None
  return tuple(key), nodes, leaf_buffers

def remember_eager(key: tuple, launch: Any, template: Template, found: Found) -> None:
  """Keep `launch` (made from `template`, the one `found`, the look-up of the same graph, gave) under its eager key,
  unless the walk bound variables (symbolic shapes, symbolic constants) or the template makes Buffers of symbolic
  sizes."""
  if found[0].var_vals or any(spec[3] is not None for spec in template.new_buffers) or \
     any(item.variables for item in template.items): return
  if len(eager_launches) >= MAX_EAGER_KEYS: eager_launches.clear()
  eager_launches[key] = launch

def _is_one_op(root: LazyBuffer) -> bool:
  """Whether the (unrealized base) root is one op over sources that need no computing: each source, or the base it
  views, is realized or has no sources itself (a constant, host data, an empty buffer); and there are few enough of
  them for the one-op walk's list scans. (`_one_op_walk` checks the same as it walks.)"""
  if len(root.srcs) > ONE_OP_MAX_SOURCES: return False
  for lb in root.srcs:
    base = lb if lb._base is None else lb._base
    if base.buffer is None and base.srcs: return False
  return True

def _unbound_entries(entries: list[tuple]) -> tuple[list[tuple], dict[str, int]]:
  """The walk's entries with bound variables replaced by the bare variables (in views, shapes and symbolic constants),
  and their values: a graph with the same structure at another value of the variables has the same key. An entry
  with nothing symbolic is kept as it is (plain loops: this runs for every eager op once any variable was bound)."""
  values: dict[str, int] = {}
  def unbound(x: Any) -> Any:
    if isinstance(x, ShapeTracker):
      st, found = x.unbind()
      values.update(found)
      return st
    if isinstance(x, UOp):
      size, found = unbind(x)
      values.update(found)
      return size
    if type(x) is tuple:
      for s in x:
        if isinstance(s, UOp): return tuple(unbound(s) for s in x)
    return x
  out = []
  for entry in entries:
    for x in entry:
      if (type(x) is ShapeTracker and x.symbolic) or isinstance(x, UOp) or type(x) is tuple and UOp in map(type, x):
        out.append(tuple(unbound(x) for x in entry))
        break
    else: out.append(entry)
  return out, values

def _arg_key(arg: Any) -> Any:
  """An arg as a key: host data by its dtype and shape only (the values are the graph's own, not the structure's);
  floats by repr, so -0.0 differs from 0.0 and NaN equals NaN."""
  kind = type(arg)
  if kind is int or kind is bool or kind is tuple: return arg   # the common args, with no array inside
  if hasattr(arg, "__array__"): return ("host", str(arg.dtype), tuple(arg.shape))
  if isinstance(arg, float): return ("float", repr(arg))
  return arg

def schedule(outs: list[LazyBuffer], keep_old: bool = True) -> list[ScheduleItem]:
  """`create_schedule(outs, commit=True)`, from the cache when a graph of the same structure was scheduled before.
  With `keep_old`, a buffer that an ASSIGN writes is first copied for values still pending that read its old data
  (schedule.keep_old_values); a TinyJit capture passes False (docs/semantics.md, "Inside a TinyJit")."""
  found = look_up(outs)
  return [] if found is None else schedule_found(found, keep_old)

# What `look_up` finds: the walk, its key, the stored template (None on a miss) and the graph's writes (the buffer's
# value, the ASSIGN) in walk order.
Found = tuple[_Walk, tuple, Optional[Template], list[tuple[LazyBuffer, LazyBuffer]]]

def look_up(outs: list[LazyBuffer] | tuple[LazyBuffer, ...], settings: Any = None) -> Optional[Found]:
  """The walk of the unrealized graph above `outs` and the template stored for its structure; None when every out is
  realized already. `settings`: current_settings() where the caller read it."""
  if len(outs) == 1:   # the eager case
    base = outs[0] if outs[0]._base is None else outs[0]._base
    if base.buffer is not None: return None
    roots = [base]
  else:
    roots = list(dict.fromkeys(o.base for o in outs if o.base.buffer is None))
    if not roots: return None
  if CollectiveGroup.made: roots = with_collective_siblings(roots)   # a collective's nodes are realized together
  if len(roots) != 1 or (walk := _one_op_walk(roots[0])) is None: walk = _Walk(roots)   # (schedule.py rule 4)
  nodes = walk.nodes
  assigns = []   # (the buffer's value, the ASSIGN) of every write; a loop, as _instantiate's
  for p in walk.unrealized:
    if nodes[p].op is Ops.ASSIGN: assigns.append((nodes[p].srcs[0].base, nodes[p]))
  key = ((settings or current_settings()).RIDERS, walk.key)   # the schedule settings change the schedule
  return walk, key, _templates.get(key), assigns

def schedule_found(found: Found, keep_old: bool = True) -> list[ScheduleItem]:
  """The committed ScheduleItems of a graph `look_up` found: the template's over this graph's Buffers, or (on a miss)
  the scheduler's, stored as a template. The walk forgets the graph afterwards (keep_old_values needs the values no
  one holds gone)."""
  walk, key, template, assigns = found
  nodes = walk.nodes
  if template is None:
    host_copies = {p for p in walk.unrealized if nodes[p].op is Ops.COPY and not nodes[p].srcs}
    scalar_nodes: list[tuple[LazyBuffer, ...]] = []
    items = create_schedule(walk.roots, commit=True, scalar_nodes=scalar_nodes)
    _store(key, _template_of(walk, items, host_copies, scalar_nodes))
  else: items = _instantiate(walk, template)
  _forget_regions(nodes)
  walk.nodes = walk.roots = []   # the graph's values this schedule did not realize live on only where something holds
  del nodes                      # them
  if not assigns or not keep_old: return items
  return keep_old_values(items, assigns)

def stored(key: tuple) -> Optional[Template]:
  """The template stored under a key `look_up` computed (after `schedule_found` stored it on a miss)."""
  return _templates.get(key)

def _forget_regions(nodes: list[LazyBuffer]) -> None:
  """The values inlined into these kernels forget their composite Region: a Region holds its root, which holds it, a
  cycle that would keep them (and the buffers they read, as pending readers) alive until the garbage collector runs."""
  for lb in nodes:
    if lb.region is not None: lb.set_region(None)

def bind(walk: _Walk, template: Template) -> list[Buffer]:
  """The template's Buffer list over this graph (its realized Buffers, then new ones), committed to the graph's nodes
  as `_instantiate` does, without ScheduleItems: for a caller that runs the template's items from a plan of its own.
  Read item values (`item_values`) first: the commits drop a root's arg."""
  nodes = walk.nodes
  bufs = walk.leaf_buffers[:]
  for device, size, dtype, symbolic_size in template.new_buffers:
    bufs.append(Buffer(device, size, dtype) if symbolic_size is None else
                _new_buffer(device, size, dtype, symbolic_size))
  for p, i, keeps_arg in template.commits: nodes[p].commit(bufs[i], keep_arg=keeps_arg)
  for lb in nodes:   # _forget_regions, inline: this is every planned eager op
    if lb.region is not None: lb.set_region(None)
  walk.nodes = walk.roots = []
  return bufs

def item_values(walk: _Walk, item: TemplateItem) -> dict[str, int]:
  """A template item's var_vals in this graph (empty without variables or scalar parameters)."""
  return _values(walk, item.variables, item.scalars) if item.variables or item.scalars else NO_VARIABLES

def _template_of(walk: _Walk, items: list[ScheduleItem], host_copies: set[int],
                 scalar_nodes: list[tuple[LazyBuffer, ...]]) -> Template:
  """The schedule over positions; `scalar_nodes[i]`: item i's lifted constants (the nodes its scalar parameters read,
  in parameter order), kept as their walk positions."""
  index: dict[int, int] = {id(b): k for k, b in enumerate(walk.leaf_buffers)}
  new_buffers: list[tuple[str, int, DType, Any]] = []
  for item in items:
    for b in item.bufs:
      if id(b) not in index:
        index[id(b)] = len(walk.leaf_buffers) + len(new_buffers)
        new_buffers.append((b.device, b.size, b.dtype, b.symbolic_size))
  commits = tuple((p, index[id(walk.nodes[p].buffer)], walk.nodes[p].op is Ops.REDUCE_AXIS)
                  for p in walk.unrealized if walk.nodes[p].buffer is not None)
  node_of_buffer = {id(walk.nodes[p].buffer): p for p, _, _ in commits if p in host_copies}
  position = {id(lb): p for p, lb in enumerate(walk.nodes)} if any(scalar_nodes) else {}
  template_items = tuple(TemplateItem(item.ast, tuple(index[id(b)] for b in item.bufs), item.output_count,
                          node_of_buffer[id(item.bufs[0])] if item.host_data is not None else None,
                          tuple(name for name in item.var_vals if name not in map(param_name, range(len(scalars)))),
                          tuple(position[id(lb)] for lb in scalars))
                         for item, scalars in zip(items, scalar_nodes))
  return Template(template_items, tuple(new_buffers), commits, len(walk.nodes))

def _store(key: tuple, template: Template) -> None:
  global _cached_nodes
  _templates[key] = template
  _cached_nodes += template.nodes
  while _cached_nodes > MAX_CACHED_NODES and len(_templates) > 1:
    _cached_nodes -= _templates.pop(next(iter(_templates))).nodes

def _instantiate(walk: _Walk, template: Template) -> list[ScheduleItem]:
  """The template's ScheduleItems over this graph's Buffers, committed to its nodes. Plain loops, not comprehensions:
  this is every eager op's hit path."""
  nodes = walk.nodes
  bufs = walk.leaf_buffers[:]
  for device, size, dtype, symbolic_size in template.new_buffers:
    bufs.append(Buffer(device, size, dtype) if symbolic_size is None else
                _new_buffer(device, size, dtype, symbolic_size))
  items: list[ScheduleItem] = []
  for ast, indices, outputs, host_node, names, scalars in template.items:
    item_bufs = []
    for i in indices: item_bufs.append(bufs[i])
    items.append(ScheduleItem(ast, tuple(item_bufs), outputs, nodes[host_node].arg if host_node is not None else None,
                              _values(walk, names, scalars) if names or scalars else NO_VARIABLES))
  for p, i, keeps_arg in template.commits:   # as create_schedule's commit: the value keeps its Buffer, forgets its
    nodes[p].commit(bufs[i], keep_arg=keeps_arg)   # sources (and its arg, but for a reduce's)
  return items

def _values(walk: _Walk, names: tuple[str, ...], scalars: tuple[int, ...]) -> dict[str, int]:
  """An item's var_vals in this graph: its variables' values, and its scalar parameters' from the constants at their
  positions (read before the commits, which drop a root's arg)."""
  values = {name: walk.var_vals[name] for name in names}
  if scalars: values.update(scalar_values([walk.nodes[p] for p in scalars]))
  return values

def _new_buffer(device: str, size: int, dtype: DType, symbolic_size: Any) -> Buffer:
  buffer = Buffer(device, size, dtype)
  if symbolic_size is not None: buffer.symbolic_size = symbolic_size
  return buffer

def clear() -> None:
  """Forget every template."""
  global _cached_nodes
  _templates.clear()
  eager_launches.clear()
  _cached_nodes = 0
