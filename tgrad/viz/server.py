"""The viz page's local web server: http.server on 127.0.0.1, serving the pages of viz/pages.py.

Routes: `/` kernels, `/kernel?id=N` one kernel's source, UOps and opts, `/graphs` the pictures, `/graph.svg?name=F`
one picture (only a file listed in the folder's graphs/), `/trace` the trace's summary and timeline, `/trace.json` the
trace file, `/paths` the benchmark database's plots. Anything else is 404. It binds to the loopback address only, so
nothing outside this machine can reach it, and it reads only the site's own files.
"""
from __future__ import annotations
import http.server, threading
from typing import Optional
from urllib.parse import parse_qs, urlparse
from tgrad.viz.pages import Site, graphs_page, kernel_page, kernels_page, paths_page, trace_page

HOST = "127.0.0.1"
DEFAULT_PORT = 8777

class Handler(http.server.BaseHTTPRequestHandler):
  site: Site   # set on the subclass made by make_server

  def do_GET(self) -> None:
    url = urlparse(self.path)
    query = parse_qs(url.query)
    pages = {"/": kernels_page, "/graphs": graphs_page, "/trace": trace_page, "/paths": paths_page}
    if url.path in pages: return self._send(200, "text/html; charset=utf-8", pages[url.path](self.site).encode())
    if url.path == "/kernel":
      try: kernel_id = int(query.get("id", [""])[0])
      except ValueError: kernel_id = -1
      if (html := kernel_page(self.site, kernel_id)) is not None:
        return self._send(200, "text/html; charset=utf-8", html.encode())
    if url.path == "/graph.svg" and (path := self.site.graph_path(query.get("name", [""])[0])) is not None:
      with open(path, "rb") as f: return self._send(200, "image/svg+xml", f.read())
    if url.path == "/trace.json":
      try:
        with open(self.site.trace_path, "rb") as f: return self._send(200, "application/json", f.read())
      except FileNotFoundError: pass
    self._send(404, "text/plain; charset=utf-8", b"not found")

  def _send(self, status: int, content_type: str, body: bytes) -> None:
    self.send_response(status)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                     "style-src 'unsafe-inline'; img-src 'self'")
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, format: str, *args) -> None: pass   # quiet: the page is for the user, not a log

def make_server(site: Site, port: int = DEFAULT_PORT) -> http.server.ThreadingHTTPServer:
  """A server for `site` on 127.0.0.1:`port` (0: any free port; `server.server_address[1]` says which)."""
  handler = type("SiteHandler", (Handler,), {"site": site})
  return http.server.ThreadingHTTPServer((HOST, port), handler)

def serve(folder: str = "", port: int = DEFAULT_PORT, trace_path: str = "", db_path: Optional[str] = None) -> None:
  """Serve the page until interrupted (Ctrl-C)."""
  server = make_server(Site(folder, trace_path, db_path), port)
  print(f"tgrad viz: http://{HOST}:{server.server_address[1]}/ (Ctrl-C stops it)")
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()

def serve_in_thread(site: Site, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
  """Start a server in a daemon thread (for tests and notebooks); returns it and its base URL."""
  server = make_server(site, port)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server, f"http://{HOST}:{server.server_address[1]}"
