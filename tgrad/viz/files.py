"""Where a run's pictures and trace are kept: the viz folder (TGRAD_VIZ_DIR, else ~/.cache/tgrad/viz) and the names of
the files in it, shared by the writer (folder.py) and the page (pages.py)."""
import os
from tgrad.helpers import cache_dir

FOLDER_ENV = "TGRAD_VIZ_DIR"
TRACE_FILE, KERNELS_FILE, GRAPHS_FOLDER = "trace.json", "kernels.json", "graphs"

def viz_folder() -> str:
  return os.environ.get(FOLDER_ENV) or os.path.join(cache_dir(), "tgrad", "viz")
