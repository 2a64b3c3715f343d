"""The subset of Chrome's trace-event format that tgrad writes, checked: what the viz page and the tests read.

`validate_trace(data)` raises ValueError naming the first event that ui.perfetto.dev or chrome://tracing would reject
or misread: the JSON Object Format (`{"traceEvents": [...]}`), each event with a string name, a phase tgrad uses
(X: complete, with a duration; C: counter, numeric args; M: metadata, args.name), integer pid and tid, and a finite
timestamp in microseconds (ts, dur >= 0). `summarize_trace` adds up the time of each phase and of each device track.
"""
from __future__ import annotations
import math
from typing import Any

PHASES = {"X", "C", "M"}
METADATA_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}

def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

def validate_trace(data: Any) -> None:
  if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
    raise ValueError("a trace is a JSON object with a 'traceEvents' list")
  for i, event in enumerate(data["traceEvents"]):
    where = f"traceEvents[{i}] ({event!r:.120})"
    if not isinstance(event, dict): raise ValueError(f"{where}: not an object")
    if not isinstance(event.get("name"), str) or not event["name"]: raise ValueError(f"{where}: no name")
    phase = event.get("ph")
    if phase not in PHASES: raise ValueError(f"{where}: phase {phase!r} is not one of {sorted(PHASES)}")
    for key in ("pid", "tid") if phase != "C" else ("pid",):
      if not isinstance(event.get(key), int) or isinstance(event.get(key), bool):
        raise ValueError(f"{where}: {key} must be an integer")
    if "args" in event and not isinstance(event["args"], dict): raise ValueError(f"{where}: args must be an object")
    if phase == "M":
      if event["name"] not in METADATA_NAMES: raise ValueError(f"{where}: metadata must be one of "
                                                               f"{sorted(METADATA_NAMES)}")
      if event["name"] in ("process_name", "thread_name") and not isinstance(event.get("args", {}).get("name"), str):
        raise ValueError(f"{where}: {event['name']} needs args.name")
      continue
    if not _number(event.get("ts")) or event["ts"] < 0: raise ValueError(f"{where}: ts must be a number >= 0")
    if phase == "X" and (not _number(event.get("dur")) or event["dur"] < 0):
      raise ValueError(f"{where}: a complete event needs dur >= 0")
    if phase == "C" and (not event.get("args") or not all(_number(v) for v in event["args"].values())):
      raise ValueError(f"{where}: a counter's args must be numbers")

def summarize_trace(data: dict) -> dict:
  """{"tracks": {track name: {event name: [count, total microseconds]}}, "events": n, "span_us": ..., "names": ...}"""
  names: dict[tuple[int, int], str] = {}
  processes: dict[int, str] = {}
  for event in data["traceEvents"]:
    if event.get("ph") == "M" and event["name"] == "process_name": processes[event["pid"]] = event["args"]["name"]
  for event in data["traceEvents"]:
    if event.get("ph") == "M" and event["name"] == "thread_name":
      names[(event["pid"], event["tid"])] = f"{processes.get(event['pid'], event['pid'])} / {event['args']['name']}"
  tracks: dict[str, dict[str, list]] = {}
  start, end = math.inf, -math.inf
  for event in data["traceEvents"]:
    if event.get("ph") != "X": continue
    track = names.get((event["pid"], event["tid"]), f"{event['pid']}/{event['tid']}")
    entry = tracks.setdefault(track, {}).setdefault(event["name"], [0, 0.0])
    entry[0] += 1
    entry[1] += event["dur"]
    start, end = min(start, event["ts"]), max(end, event["ts"] + event["dur"])
  return {"tracks": tracks, "events": len(data["traceEvents"]), "span_us": max(end - start, 0.0),
          "start_us": start if math.isfinite(start) else 0.0, "track_names": names}
