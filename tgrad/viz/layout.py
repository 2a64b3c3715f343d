"""tgrad's own drawing of a GraphPicture as SVG, for machines without Graphviz.

A two-level layered layout. Blocks are the kernels (clusters) and the nodes outside any kernel; each block's nodes are
put in layers by their longest path from the block's sources, then the blocks themselves in layers by their longest
path in the graph of blocks, ordered inside a layer by the mean position of their sources (the barycentre rule,
which keeps edges short and mostly uncrossed). Edges are cubic curves from the bottom of a source to the top of its
user. Every text is XML-escaped. Output: one `<svg>` element, no script, no external reference.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr
from typing import TYPE_CHECKING
if TYPE_CHECKING: from tgrad.viz.graph import GraphPicture, GraphNode   # drawn here, built there

REGION_COLOURS = ("#cde4ff", "#ffe0b3", "#d5f5d5", "#f5d5f0", "#fff5b3", "#d9d2f5", "#ffd3d3", "#c9f1ef")
INPUT_COLOUR, PLAIN_COLOUR, OUTPUT_COLOUR = "#eeeeee", "#ffffff", "#c8e6c9"

def fill_colour(picture: GraphPicture, node: GraphNode) -> str:
  """A node's colour, in dot's picture and tgrad's: its region's, else by kind (input, output, op)."""
  if node.region is not None: return REGION_COLOURS[node.region % len(REGION_COLOURS)]
  return {"input": INPUT_COLOUR, "output": OUTPUT_COLOUR}.get(node.kind, PLAIN_COLOUR)

CHAR_WIDTH, LINE_HEIGHT, FONT_SIZE = 6.6, 13, 11   # px, for an 11 px sans-serif font
NODE_PADDING, NODE_GAP, LAYER_GAP = 8, 14, 34      # px: inside a node, between nodes, between node layers
BLOCK_PADDING, BLOCK_TITLE, BLOCK_GAP = 10, 18, 28   # px: inside a cluster, its title's height, between blocks
MARGIN = 16
MAX_LABEL_CHARS = 48

@dataclass
class _Block:
  """A kernel's cluster, or one node outside any kernel; positions are relative to the block until placed."""
  label: str
  nodes: list[GraphNode]
  width: float = 0.0
  height: float = 0.0
  x: float = 0.0
  y: float = 0.0
  offsets: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)   # node → (x, y, w, h)

def _node_size(node: GraphNode) -> tuple[float, float]:
  longest = max((min(len(line), MAX_LABEL_CHARS) for line in node.lines), default=1)
  return longest * CHAR_WIDTH + 2 * NODE_PADDING, len(node.lines) * LINE_HEIGHT + NODE_PADDING

def _longest_path_layers(items: list[int], preds: dict[int, list[int]]) -> dict[int, int]:
  """Layer of each item: 0 for one without predecessors among `items`, else one more than its deepest predecessor.
  `items` must be in an order where predecessors come first (the snapshot's order is reversed depth-first, so this
  walks it until nothing changes, which a DAG reaches in at most len(items) passes and usually in two)."""
  layer = {i: 0 for i in items}
  for _ in range(len(items)):
    changed = False
    for i in items:
      deepest = max((layer[p] + 1 for p in preds.get(i, ()) if p in layer and p != i), default=0)
      if deepest > layer[i]: layer[i], changed = deepest, True
    if not changed: break
  return layer

def _arrange_block(block: _Block, preds: dict[int, list[int]]) -> None:
  ids = [n.node_id for n in block.nodes]
  layers = _longest_path_layers(ids, preds)
  rows: dict[int, list[GraphNode]] = {}
  for n in block.nodes: rows.setdefault(layers[n.node_id], []).append(n)
  titled = bool(block.label)
  y = BLOCK_PADDING + BLOCK_TITLE if titled else 0.0
  width = 0.0
  for depth in sorted(rows):
    x, tallest = BLOCK_PADDING if titled else 0.0, 0.0
    for n in rows[depth]:
      w, h = _node_size(n)
      block.offsets[n.node_id] = (x, y, w, h)
      x += w + NODE_GAP
      tallest = max(tallest, h)
    width = max(width, x - NODE_GAP + (BLOCK_PADDING if titled else 0.0))
    y += tallest + LAYER_GAP
  block.width = max(width, len(block.label) * CHAR_WIDTH + 2 * BLOCK_PADDING if titled else 0.0)
  block.height = y - LAYER_GAP + (BLOCK_PADDING if titled else 0.0)

def layout_svg(picture: GraphPicture) -> str:
  """The picture as one SVG element (see the module doc)."""
  preds: dict[int, list[int]] = {}
  for source, user, _ in picture.edges: preds.setdefault(user, []).append(source)
  blocks: list[_Block] = [_Block(label, [n for n in picture.nodes if n.kernel == k])
                          for k, label in enumerate(picture.kernels)]
  blocks += [_Block("", [n]) for n in picture.nodes if n.kernel is None]
  blocks = [b for b in blocks if b.nodes]
  block_of = {n.node_id: b for b, block in enumerate(blocks) for n in block.nodes}
  for block in blocks: _arrange_block(block, preds)
  block_preds: dict[int, list[int]] = {}
  for source, user, _ in picture.edges:
    if block_of[source] != block_of[user]: block_preds.setdefault(block_of[user], []).append(block_of[source])
  order = sorted(range(len(blocks)), key=lambda b: min(n.node_id for n in blocks[b].nodes), reverse=True)
  layers = _longest_path_layers(order, block_preds)
  rows: dict[int, list[int]] = {}
  for b in order: rows.setdefault(layers[b], []).append(b)
  y, right = float(MARGIN + (LINE_HEIGHT + 8 if picture.title else 0)), 0.0
  centre: dict[int, float] = {}
  for depth in sorted(rows):
    row = sorted(rows[depth], key=lambda b: _barycentre(b, block_preds, centre))
    x, tallest = float(MARGIN), 0.0
    for b in row:
      block = blocks[b]
      block.x, block.y = x, y
      centre[b] = x + block.width / 2
      x += block.width + BLOCK_GAP
      tallest = max(tallest, block.height)
    right = max(right, x - BLOCK_GAP)
    y += tallest + BLOCK_GAP
  width, height = right + MARGIN, y - BLOCK_GAP + MARGIN
  legend = [f"region {i}: {r}" for i, r in enumerate(picture.regions)]
  height += len(legend) * LINE_HEIGHT + (8 if legend else 0)
  width = max(width, max((len(s) for s in legend + [picture.title]), default=0) * CHAR_WIDTH + 2 * MARGIN)
  return _draw(picture, blocks, block_of, width, height, legend, y - BLOCK_GAP + 8)

def _barycentre(b: int, block_preds: dict[int, list[int]], centre: dict[int, float]) -> float:
  placed = [centre[p] for p in block_preds.get(b, ()) if p in centre]
  return sum(placed) / len(placed) if placed else float("inf")

def _draw(picture: GraphPicture, blocks: list[_Block], block_of: dict[int, int], width: float, height: float,
          legend: list[str], legend_y: float) -> str:
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
         f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="{FONT_SIZE}">',
         '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
         'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
         '<rect width="100%" height="100%" fill="white"/>']
  if picture.title:
    out.append(f'<text x="{MARGIN}" y="{MARGIN + LINE_HEIGHT - 2}" font-size="13">{escape(picture.title)}</text>')
  box: dict[int, tuple[float, float, float, float]] = {}
  for block in blocks:
    if block.label:
      out.append(f'<g class="cluster"><rect x="{block.x:.1f}" y="{block.y:.1f}" width="{block.width:.1f}" '
                 f'height="{block.height:.1f}" rx="6" fill="none" stroke="#1565c0" stroke-dasharray="5,3"/>'
                 f'<text x="{block.x + BLOCK_PADDING:.1f}" y="{block.y + BLOCK_TITLE - 4:.1f}" fill="#1565c0">'
                 f'{escape(block.label)}</text></g>')
    for node in block.nodes:
      dx, dy, w, h = block.offsets[node.node_id]
      box[node.node_id] = (block.x + dx, block.y + dy, w, h)
  for source, user, label in picture.edges:
    sx, sy, sw, sh = box[source]
    ux, uy, uw, _ = box[user]
    x1, y1, x2, y2 = sx + sw / 2, sy + sh, ux + uw / 2, uy
    bend = max(abs(y2 - y1) / 2, 20)
    out.append(f'<path class="edge" d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} '
               f'{x2:.1f},{y2:.1f}" fill="none" stroke="#555" marker-end="url(#arrow)"/>')
    if label:
      out.append(f'<text x="{(x1 + x2) / 2 + 3:.1f}" y="{(y1 + y2) / 2:.1f}" font-size="8" fill="#555">'
                 f'{escape(label)}</text>')
  for node in picture.nodes:
    x, y, w, h = box[node.node_id]
    out.append(f'<g class="node"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" '
               f'fill={quoteattr(fill_colour(picture, node))} stroke="#333" '
               f'stroke-width="{2 if node.kind == "output" else 1}"/>')
    for i, line in enumerate(node.lines):
      text = line if len(line) <= MAX_LABEL_CHARS else line[:MAX_LABEL_CHARS - 3] + "..."
      out.append(f'<text x="{x + w / 2:.1f}" y="{y + NODE_PADDING / 2 + (i + 1) * LINE_HEIGHT - 3:.1f}" '
                 f'text-anchor="middle">{escape(text)}</text>')
    out.append("</g>")
  for i, line in enumerate(legend):
    out.append(f'<text x="{MARGIN}" y="{legend_y + (i + 1) * LINE_HEIGHT:.1f}">{escape(line)}</text>')
  out.append("</svg>")
  return "\n".join(out)
