"""Graph pictures (kernels as clusters, regions and their lowerings), tgrad's own SVG layout, the paths plots and
the viz server's pages: what they show, that they escape it, and that nothing outside the viz folder is served."""
import os, subprocess, sys, urllib.error, urllib.request
import xml.etree.ElementTree as ET
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.schedule import create_schedule
from tgrad.ops import Ops
from tgrad.viz import graph
from tgrad.viz.graph import GraphNode, GraphPicture, dot_available
from tgrad.viz.plots import PlotPoint, pareto_front, plot_svg
from tgrad.viz.pages import Site, paths_page
from tgrad.viz.server import serve_in_thread
sys.path.insert(0, os.path.dirname(__file__))
from viz_run import make_paths_db, make_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SVG = "{http://www.w3.org/2000/svg}"

def kernel_count(t: Tensor) -> int:
  return sum(1 for item in create_schedule([t.lazydata.base]) if item.ast.op is Ops.SINK)

def test_fused_kernel_is_one_cluster_and_nothing_is_realized():
  rng = np.random.default_rng(0)
  a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in [(7, 5), (7, 5), (5,)])
  ta, tb, tc = Tensor(a).realize(), Tensor(b).realize(), Tensor(c).realize()
  out = (ta * tb + tc).sum()
  picture = graph(out)
  assert out.lazydata.base.buffer is None   # graph() schedules without committing
  assert len(picture.kernels) == 1 == kernel_count(out)
  ops = {n.lines[0] for n in picture.nodes if n.kernel == 0}
  assert {"MUL", "ADD"} <= ops and any(line.startswith("REDUCE ADD") for line in ops)
  assert sum(1 for n in picture.nodes if n.kind == "input") == 3
  np.testing.assert_allclose(out.numpy(), (a * b + c).sum(), rtol=1e-5)

def test_softmax_clusters_match_the_schedule_and_name_the_lowering(tmp_path):
  x = Tensor(np.random.default_rng(1).standard_normal((6, 9), dtype=np.float32)).realize()
  y = x.softmax(-1)
  picture = graph(y, str(tmp_path / "softmax.dot"))
  assert len(picture.kernels) == kernel_count(y)
  assert any("softmax → default" in r for r in picture.regions)
  assert "subgraph cluster_k0" in (tmp_path / "softmax.dot").read_text()
  members = [n for n in picture.nodes if n.kind == "op"]
  assert members and all(n.kernel is not None for n in members)   # every computed node is in some kernel

def _parse(svg: str) -> ET.Element: return ET.fromstring(svg)

def test_own_layout_is_valid_svg_with_clusters_and_escapes_labels():
  nodes = [GraphNode(0, ("buffer", "<script>alert(1)</script>"), "input"), GraphNode(1, ("ADD & MUL",), "op", 0),
           GraphNode(2, ("REDUCE",), "output", 0, region=0), GraphNode(3, ("EXP",), "output", 1)]
  edges = [(0, 1, "view"), (1, 2, ""), (2, 3, "")]
  picture = GraphPicture('title "<&>"', nodes, edges, ["kernel 0: r_<8>", "kernel 1"], ["softmax → <online>"])
  svg = picture.svg(use_dot=False)
  root = _parse(svg)   # well-formed XML: every text escaped
  assert "<script>" not in svg and "&lt;script&gt;" in svg
  assert len(root.findall(f".//{SVG}g[@class='cluster']")) == 2
  assert len(root.findall(f".//{SVG}g[@class='node']")) == 4 and len(root.findall(f".//{SVG}path[@class='edge']")) == 3
  boxes = {}
  for g in root.findall(f".//{SVG}g[@class='node']"):
    rect = g.find(f"{SVG}rect")
    boxes[g.find(f"{SVG}text").text] = float(rect.get("y"))
  assert boxes["buffer"] < boxes["ADD & MUL"] < boxes["REDUCE"] < boxes["EXP"]   # top down

@pytest.mark.skipif(not dot_available(), reason="Graphviz's dot is not installed")
def test_dot_renders_the_same_picture():
  x = Tensor(np.ones((4, 4), np.float32)).realize()
  root = _parse(graph((x.exp() + 1).sum(0)).svg(use_dot=True))
  assert len([g for g in root.iter(f"{SVG}g") if g.get("class") == "cluster"]) == 1

def test_graph_environment_writes_a_picture_per_realize(tmp_path):
  script = "import numpy as np; from tgrad import Tensor; x = Tensor(np.ones(8, np.float32)); (x * 2).sum().numpy()"
  env = {**os.environ, "GRAPH": "1", "TGRAD_VIZ_DIR": str(tmp_path), "DEVICE": "LLVM", "PYTHONPATH": ROOT}
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  files = sorted(os.listdir(tmp_path / "graphs"))
  assert "realize_0001.svg" in files and "realize_0001.dot" in files
  _parse((tmp_path / "graphs" / "realize_0001.svg").read_text())

def test_pareto_front_against_brute_force():
  rng = np.random.default_rng(2)
  points = [PlotPoint(f"p{i}", "", float(t), float(e), bool(ok)) for i, (t, e, ok) in
            enumerate(zip(rng.uniform(1, 100, 40), 10 ** rng.uniform(-8, -2, 40), rng.random(40) > 0.2))]
  front = {p.path_id for p in pareto_front(points)}
  ok = [p for p in points if p.ok]
  def beats(q, p) -> bool: return q.seconds <= p.seconds and q.error <= p.error and (q.seconds, q.error) != (p.seconds,
                                                                                                             p.error)
  dominated = {p.path_id for p in ok for q in ok if q is not p and beats(q, p)}
  assert front == {p.path_id for p in ok} - dominated

def test_paths_page_plots_every_graph_and_escapes(tmp_path):
  db = make_paths_db(str(tmp_path), graphs=3)
  html = paths_page(Site(str(tmp_path), db_path=db))
  assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="plot"') == 3
  assert "<b>&" not in html and "&lt;b&gt;&amp;" in html
  assert "TOLERANCE 1e-05" in html
  from tgrad.paths.db import PathsDB, summarize
  runs = PathsDB(db).runs(PathsDB(db).graphs()[0][0], "LLVM")
  _parse(plot_svg("t", summarize(runs), []))

def test_server_pages_and_only_the_folder_is_served(tmp_path):
  make_run(str(tmp_path), jit_calls=3)
  server, url = serve_in_thread(Site(str(tmp_path), db_path=make_paths_db(str(tmp_path))))
  try:
    assert server.server_address[0] == "127.0.0.1"
    def get(path: str) -> str: return urllib.request.urlopen(url + path, timeout=30).read().decode()
    kernels = get("/")
    assert 'class="kernels"' in kernels and "/kernel?id=0" in kernels
    assert "<pre class=\"source\">" in get("/kernel?id=0")
    assert get("/graphs").count('<img class="graph"') == len(os.listdir(tmp_path / "graphs")) // 2
    assert get("/graph.svg?name=realize_0001.svg").startswith("<svg")
    assert 'class="timeline"' in get("/trace") and get("/trace.json").startswith("{")
    for bad in ("/graph.svg?name=../trace.json", "/graph.svg?name=/etc/passwd", "/kernel?id=x", "/nothing"):
      with pytest.raises(urllib.error.HTTPError) as error: get(bad)
      assert error.value.code == 404
  finally: server.shutdown()
