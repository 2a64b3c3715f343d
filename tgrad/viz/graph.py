"""Pictures of a lazy graph and how the scheduler cut it into kernels.

Input: the LazyBuffers about to be realized (`observe`, installed for GRAPH=1, runs before the realize's schedule and
reads the result after it), or one Tensor (`graph`, which schedules without committing anything). Output: a
`GraphPicture`: one node per base of the unrealized graph (op, shape, dtype; realized inputs as buffers), one edge
per source (labelled "view" where the value is read through a movement), each kernel as a cluster of the nodes it
computes (its output and everything fused into it), and each composite region with the lowering it took (nodes
coloured by region, the root labelled). `to_dot()` is Graphviz's language; `svg()` renders it with the `dot` program
when it is installed and with tgrad's own layout (viz/layout.py) when it is not.
"""
from __future__ import annotations
import os, shutil, subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.viz.layout import fill_colour, layout_svg

# A graph with more nodes than this is drawn one node per kernel (dot takes minutes, and nobody reads it).
MAX_PICTURE_NODES = 600
DOT_TIMEOUT_SECONDS = 60
ARG_CHARS = 24   # an op's argument is shown cut to this many characters

@dataclass
class GraphNode:
  node_id: int
  lines: tuple[str, ...]       # the label, one line each
  kind: str                    # "input" (a realized buffer), "op", or "output" (a realized value of this schedule)
  kernel: Optional[int] = None   # the kernel (cluster) that computes it
  region: Optional[int] = None   # the composite region it belongs to
  shared: int = 1                # how many kernels compute it (an elementwise value recomputed in each reader)

@dataclass
class GraphPicture:
  """A lazy graph cut into kernels, ready to draw (see the module doc)."""
  title: str
  nodes: list[GraphNode] = field(default_factory=list)
  edges: list[tuple[int, int, str]] = field(default_factory=list)   # (source node, user node, label)
  kernels: list[str] = field(default_factory=list)                  # cluster labels, by kernel index
  regions: list[str] = field(default_factory=list)                  # "softmax → online", by region index
  collapsed: bool = False                                           # drawn one node per kernel

  def to_dot(self) -> str:
    lines = ["digraph tgrad {", f'  label="{_dot_text(self.title)}"; labelloc=t; fontname="Helvetica";',
             "  rankdir=TB; compound=true;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8, color="#555555"];']
    def node_line(node: GraphNode) -> str:
      label = "\\n".join(_dot_text(line) for line in node.lines)
      border = ", penwidth=2" if node.kind == "output" else ""
      return f'    n{node.node_id} [label="{label}", fillcolor="{fill_colour(self, node)}"{border}];'
    for k, label in enumerate(self.kernels):
      lines.append(f"  subgraph cluster_k{k} {{")
      lines.append(f'    label="{_dot_text(label)}"; style="rounded,dashed"; color="#1565c0"; fontcolor="#1565c0";')
      lines += [node_line(n) for n in self.nodes if n.kernel == k]
      lines.append("  }")
    lines += [node_line(n) for n in self.nodes if n.kernel is None]
    for source, user, label in self.edges:
      lines.append(f'  n{source} -> n{user}' + (f' [label="{_dot_text(label)}"];' if label else ";"))
    if self.regions:
      legend = "\\l".join(_dot_text(f"region {i}: {r}") for i, r in enumerate(self.regions)) + "\\l"
      lines.append(f'  legend [shape=note, label="{legend}", fillcolor="#fffde7"];')
    lines.append("}")
    return "\n".join(lines) + "\n"

  def svg(self, use_dot: Optional[bool] = None) -> str:
    """The picture as SVG: through Graphviz's `dot` when it is installed (or `use_dot=True`), else tgrad's layout."""
    if use_dot is None: use_dot = dot_available()
    if use_dot:
      done = subprocess.run(["dot", "-Tsvg"], input=self.to_dot(), capture_output=True, text=True,
                            timeout=DOT_TIMEOUT_SECONDS)
      if done.returncode != 0: raise RuntimeError(f"dot failed ({done.returncode}): {done.stderr[:500]}")
      return done.stdout[done.stdout.index("<svg"):]   # without the XML prolog and DOCTYPE: inlined in HTML
    return layout_svg(self)

  def write(self, path: str) -> str:
    """Write `path` (.svg: the picture; .dot: the Graphviz source); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f: f.write(self.to_dot() if path.endswith(".dot") else self.svg())
    return path

def dot_available() -> bool: return shutil.which("dot") is not None

def _dot_text(text: str) -> str:
  """Text inside a double-quoted DOT string: backslashes and quotes escaped, no raw newlines."""
  return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")

def _short(value: Any) -> str:
  text = str(value)
  return text if len(text) <= ARG_CHARS else text[:ARG_CHARS - 3] + "..."

def _shape_text(lb: LazyBuffer) -> str:
  return f"{tuple(lb.shape)} {lb.dtype.name if hasattr(lb.dtype, 'name') else lb.dtype}"

def _op_line(lb: LazyBuffer) -> str:
  op = lb.op.name if lb.op is not None else "?"
  if lb.op is Ops.CONST: return f"CONST {_short(lb.arg)}"
  if lb.op is Ops.REDUCE_AXIS and isinstance(lb.arg, tuple) and lb.arg:
    reduce_op = getattr(lb.arg[0], "name", lb.arg[0])
    return f"REDUCE {reduce_op} axes {_short(lb.arg[1]) if len(lb.arg) > 1 else ''}"
  if lb.op is Ops.CUSTOM: return f"CUSTOM {_short(getattr(lb.arg, 'name', lb.arg))}"
  return op

# ---- taking a picture around a schedule

class Snapshot:
  """The unrealized graph above some LazyBuffers, taken before they are scheduled (a committed schedule drops the
  sources of what it realizes); `picture(buffers_of, items)` cuts it by what the schedule realized."""
  def __init__(self, lbs: Sequence[LazyBuffer], title: str):
    self.title = title
    self.bases: list[LazyBuffer] = []
    self.number: dict[int, int] = {}
    self.sources: list[list[tuple[int, bool]]] = []   # per node: (source node, read through a view)
    self.regions: list[Any] = []
    self.region_of: dict[int, int] = {}
    stack = [lb.base for lb in lbs]
    outputs = {id(lb.base) for lb in lbs}
    order: list[LazyBuffer] = []
    while stack:
      lb = stack.pop()
      if id(lb) in self.number: continue
      self.number[id(lb)] = len(order)
      order.append(lb)
      if lb.buffer is None: stack.extend(s.base for s in reversed(lb.srcs))
    self.bases = order
    self.was_realized = [lb.buffer is not None for lb in order]
    self.is_output = [id(lb) in outputs for lb in order]
    for lb in order:
      srcs = lb.srcs if lb.buffer is None else ()
      self.sources.append([(self.number[id(s.base)], not s.is_base) for s in srcs])
      if lb.buffer is None and lb.region is not None and id(lb.region) not in {id(r) for r in self.regions}:
        self.regions.append(lb.region)
    self.lines = [self._lines(lb) for lb in order]
    for r, region in enumerate(self.regions): self._mark_region(r, region)
    self.region_labels = [f"{region.name} → {region.current}" for region in self.regions]

  def _lines(self, lb: LazyBuffer) -> tuple[str, ...]:
    if lb.buffer is not None: return ("buffer", _shape_text(lb))
    lines = [_op_line(lb), _shape_text(lb)]
    if lb.region is not None: lines.insert(0, f"[{lb.region.name} → {lb.region.current}]")
    return tuple(lines)

  def _mark_region(self, r: int, region: Any) -> None:
    """Every node between the region's root and its inputs belongs to it (the innermost region wins: regions
    are listed outermost first, so inner ones overwrite)."""
    inputs = {id(x.base) for x in region.inputs}
    stack = [region.root]
    seen: set[int] = set()
    while stack:
      lb = stack.pop()
      if id(lb) in seen or id(lb) in inputs or id(lb) not in self.number or lb.buffer is not None: continue
      seen.add(id(lb))
      self.region_of[self.number[id(lb)]] = r
      stack.extend(s.base for s in lb.srcs)

  def picture(self, realized_buffer: Callable[[LazyBuffer], Any], kernel_names: dict[int, str]) -> GraphPicture:
    """The picture once scheduled: `realized_buffer(lb)` is the Buffer the schedule gave a base (None: fused into
    its readers); `kernel_names` maps id(Buffer) to the label of the step that writes it."""
    count = len(self.bases)
    made = [None if self.was_realized[i] else realized_buffer(lb) for i, lb in enumerate(self.bases)]
    kernel_of_node: dict[int, int] = {}
    labels: list[str] = []
    for i, buffer in enumerate(made):
      if buffer is None: continue
      kernel_of_node[i] = len(labels)
      labels.append(kernel_names.get(id(buffer), "kernel"))
    # each kernel's members: its output and the unrealized bases above it up to realized values
    shared = [0] * count
    owner: dict[int, int] = dict(kernel_of_node)
    for output, k in kernel_of_node.items():
      stack, seen = [s for s, _ in self.sources[output]], set()
      while stack:
        i = stack.pop()
        if i in seen or self.was_realized[i] or made[i] is not None: continue
        seen.add(i)
        shared[i] += 1
        owner.setdefault(i, k)
        stack.extend(s for s, _ in self.sources[i])
    nodes = []
    for i in range(count):
      kind = "input" if self.was_realized[i] else "output" if made[i] is not None else "op"
      lines = self.lines[i] + ((f"recomputed in {shared[i]} kernels",) if shared[i] > 1 else ())
      nodes.append(GraphNode(i, lines, kind, owner.get(i), self.region_of.get(i), max(shared[i], 1)))
    edges = [(s, i, "view" if through_view else "") for i in range(count) for s, through_view in self.sources[i]]
    picture = GraphPicture(self.title, nodes, edges, [f"kernel {k}: {label}" for k, label in enumerate(labels)],
                           self.region_labels)
    return collapse(picture) if count > MAX_PICTURE_NODES else picture

def collapse(picture: GraphPicture) -> GraphPicture:
  """One node per kernel (and per input buffer): the picture of a graph too big to draw node by node."""
  members: dict[int, int] = {}
  nodes: list[GraphNode] = []
  for k, label in enumerate(picture.kernels):
    nodes.append(GraphNode(k, (label, f"{sum(1 for n in picture.nodes if n.kernel == k)} ops"), "output"))
  inputs = [n for n in picture.nodes if n.kernel is None]
  for n in inputs:
    members[n.node_id] = len(nodes)
    nodes.append(GraphNode(len(nodes), n.lines, n.kind))
  for n in picture.nodes:
    if n.kernel is not None: members[n.node_id] = n.kernel
  edges = sorted({(members[s], members[u], "") for s, u, _ in picture.edges if members[s] != members[u]})
  title = f"{picture.title} ({len(picture.nodes)} nodes: one per kernel)"
  return GraphPicture(title, nodes, edges, [], picture.regions, collapsed=True)

def kernel_label(item: Any) -> str:
  """What a ScheduleItem is, for its cluster's label: a kernel's name (as codegen names it), or the copy/custom step."""
  if item.ast.op is Ops.SINK:
    from tgrad.codegen.kernel import Kernel
    from tgrad.device import Device
    try: return Kernel(item.ast, Device[item.bufs[0].device].renderer).name
    except Exception as error:   # a picture must not stop a run: the kernel is named by its error instead
      return f"kernel ({type(error).__name__})"
  return item.ast.op.name.lower()

def names_of_items(items: Sequence[Any]) -> dict[int, str]:
  """id(output Buffer) → the label of the item writing it."""
  return {id(buffer): kernel_label(item) for item in items for buffer in item.outputs}

def graph(tensor: Any, path: Optional[str] = None) -> GraphPicture:
  """The picture of what realizing `tensor` (a Tensor or LazyBuffer) would do, scheduled without committing anything
  (the tensor is left as it was). With `path` (.svg or .dot) it is written there too."""
  from tgrad.schedule import create_schedule
  lb = getattr(tensor, "lazydata", tensor)
  snapshot = Snapshot([lb], f"{tuple(lb.shape)} {lb.dtype}")
  if lb.base.buffer is not None: items, buffers = [], {}
  else:
    buffers: dict = {}
    items = create_schedule([lb.base], commit=False, buffers=buffers)
  picture = snapshot.picture(lambda base: buffers.get(base), names_of_items(items))
  if path: picture.write(path)
  return picture
