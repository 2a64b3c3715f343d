"""What the database's readers show: the tolerances `python -m tgrad.paths show` and the viz page list, a recorded
graph's default tolerance, and the selection each tolerance makes on this machine (hardware, version, settings)."""
from __future__ import annotations
from tgrad.dtype import to_dtype
from tgrad.helpers import code_settings
from tgrad.paths.db import PathsDB, Selection, default_tolerance, select
from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version

SHOWN_TOLERANCES = (1e-2, 1e-4, 1e-6)

def graph_dtype_tolerance(desc: dict) -> float:
  """The default tolerance of a recorded graph's narrowest float output (its description names dtypes as str() does,
  e.g. "dtypes.float16")."""
  names = [str(d).rsplit(".", 1)[-1] for _, d in desc.get("outputs", [])]
  floats = [to_dtype(n) for n in names if to_dtype(n).is_float]
  return min((default_tolerance(d) for d in floats), default=1e-5)

def selection_here(db: PathsDB, key: str, device: str, tolerance: float) -> Selection:
  """The path `tolerance` selects among the graph's recorded runs for this machine, tgrad version and settings."""
  return select(db.runs(key, device), tolerance, hardware_fingerprint(device), tgrad_version(), code_settings())
