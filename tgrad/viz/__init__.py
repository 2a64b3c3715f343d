"""See inside a run: pictures of the lazy graph and its kernels, and a local web page of kernels, graphs, the trace
and the benchmark database.

`graph(tensor)` pictures what realizing a tensor would do (viz/graph.py); GRAPH=1 writes a picture for every realize
into the viz folder; `python -m tgrad.viz [--port N]` serves the page (viz/server.py), and VIZ=1 serves it when a
script ends, with the kernels and the trace of its run (tgrad/profiler.py records them).
"""
from tgrad.viz.graph import GraphPicture, graph

__all__ = ["GraphPicture", "graph"]
