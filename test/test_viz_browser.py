"""The viz page in a real browser: headless Chromium loads each page from the local server and must render the
kernel list, the graph pictures (every <img> loaded) and the paths plots, with no console message of any kind; the
trace it links to must be valid trace-event JSON. Skipped only when no Chromium is installed (`.ci/run` installs
Debian's `chromium`)."""
import json, os, re, shutil, subprocess, sys, urllib.request
import pytest
from tgrad.viz.pages import Site
from tgrad.viz.server import serve_in_thread
from tgrad.viz.trace_format import validate_trace
sys.path.insert(0, os.path.dirname(__file__))
from viz_run import make_paths_db, make_run  # noqa: E402

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install -y chromium)")
BROWSER_TIMEOUT_SECONDS = 90
VIRTUAL_TIME_MS = 3000   # headless Chromium runs the page's timers and load events for this long before dumping
CONSOLE_LINE = re.compile(r"CONSOLE[:(]")

def browse(url: str) -> tuple[str, list[str]]:
  """The DOM after the page loaded and ran, and every console line the browser logged."""
  done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                         f"--virtual-time-budget={VIRTUAL_TIME_MS}", "--dump-dom", url],
                        capture_output=True, text=True, timeout=BROWSER_TIMEOUT_SECONDS)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout, [line for line in done.stderr.splitlines() if CONSOLE_LINE.search(line)]

@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("viz"))
  make_run(folder, jit_calls=3)
  server, url = serve_in_thread(Site(folder, db_path=make_paths_db(folder)))
  yield url
  server.shutdown()

def loaded(dom: str) -> bool: return 'data-loaded="yes"' in dom and 'data-broken-images="0"' in dom

def test_kernel_list(site_url):
  dom, console = browse(site_url + "/")
  assert console == [] and loaded(dom)
  assert len(re.findall(r'<a href="/kernel\?id=\d+">', dom)) >= 3
  dom, console = browse(site_url + "/kernel?id=0")
  assert console == [] and '<pre class="source">' in dom and "define" in dom   # LLVM IR: a `define` of the kernel

def test_graph_pictures(site_url):
  dom, console = browse(site_url + "/graphs")
  assert console == [] and loaded(dom)
  assert dom.count('<img class="graph"') >= 3   # every picture loaded: data-broken-images is 0

def test_paths_plots(site_url):
  dom, console = browse(site_url + "/paths")
  assert console == [] and loaded(dom)
  assert dom.count('class="plot"') == 2 and dom.count('class="front"') >= 1 and dom.count('class="chosen"') >= 1

def test_trace_page_and_file(site_url):
  dom, console = browse(site_url + "/trace")
  assert console == [] and loaded(dom) and 'class="timeline"' in dom
  data = json.loads(urllib.request.urlopen(site_url + "/trace.json", timeout=30).read())
  validate_trace(data)
  assert any(e.get("cat") == "jit replay" for e in data["traceEvents"])
