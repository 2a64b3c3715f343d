"""A/B of two trees of tgrad in one machine session: a benchmark command run from an older commit's tree and from this
one, alternated round by round, the lines it prints that match a pattern collected side by side.

A change to generated code is sized by its effect on a whole run (a decode step), with the two trees alternated on
the same machine: a GPU's or this VM's speed drifts from minute to minute by more than most changes are worth, so a
number from another call, or from a chain of one kernel (bench/probes/kernel_chain.py), does not rank them.

  python bench/ab_trees.py prepare COMMIT        # here (needs git): the commit's tgrad/ and bench/ into AB_TREE
  python bench/ab_trees.py run [--rounds 2] [--grep REGEX] -- CMD ARG...   # where it runs (the GPU machine:
                                                   # carry AB_TREE), CMD run from AB_TREE ("old") and from here ("new")

`run` prints each round's matching lines of each tree, then, for every number-valued JSON key it saw
("decode_step_gpu_ms_at_40": 0.3876,), its values per tree. The old tree is the commit's tgrad/ and bench/ only:
the command must run from them (bench scripts put their own tree first on sys.path).
"""
from __future__ import annotations
import argparse, re, subprocess, sys
from pathlib import Path

AB_TREE = Path(".ab") / "old"            # git-ignored: the older tree, carried to the machine that runs the command
DEFAULT_GREP = r'"quant"|"dtype"|_ms|tokens_per_second'
JSON_NUMBER = re.compile(r'"([A-Za-z0-9_]+)":\s*(-?[0-9.]+(?:e-?[0-9]+)?)')

def prepare(commit: str) -> None:
  """The commit's tgrad/ and bench/ into AB_TREE (replacing what is there)."""
  subprocess.run(["rm", "-rf", str(AB_TREE)], check=True)
  AB_TREE.mkdir(parents=True)
  archive = subprocess.run(["git", "archive", commit, "tgrad", "bench"], check=True, capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", str(AB_TREE)], input=archive, check=True)
  (AB_TREE / "COMMIT").write_text(subprocess.run(["git", "rev-parse", commit], check=True, capture_output=True,
                                                 text=True).stdout)
  print(f"{commit} → {AB_TREE}/ (tgrad, bench); carry {AB_TREE.parent} with the command")

def run_once(command: list[str], where: Path, pattern: re.Pattern) -> list[str]:
  result = subprocess.run(command, cwd=where, capture_output=True, text=True)
  lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if pattern.search(line)]
  if result.returncode != 0: lines.append(f"(exit status {result.returncode})")
  return lines

def run(command: list[str], rounds: int, grep: str) -> None:
  if not AB_TREE.is_dir(): sys.exit(f"no {AB_TREE}: run `python bench/ab_trees.py prepare COMMIT` first and carry it")
  pattern = re.compile(grep)
  old_commit = (AB_TREE / "COMMIT").read_text().strip()[:12] if (AB_TREE / "COMMIT").exists() else "?"
  values: dict[str, dict[str, list[str]]] = {}
  for r in range(1, rounds + 1):
    for tree, where in (("old", AB_TREE), ("new", Path("."))):
      lines = run_once(command, where, pattern)
      print(f"== {tree} ({old_commit if tree == 'old' else 'this tree'}), round {r}")
      for line in lines:
        print("  " + line)
        for key, number in JSON_NUMBER.findall(line): values.setdefault(key, {}).setdefault(tree, []).append(number)
  print("== side by side (each round's values, in order)")
  for key, per_tree in values.items():
    print(f"  {key}: old {' / '.join(per_tree.get('old', []))}; new {' / '.join(per_tree.get('new', []))}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="verb", required=True)
  p = sub.add_parser("prepare", help="the commit's tgrad/ and bench/ into " + str(AB_TREE))
  p.add_argument("commit")
  r = sub.add_parser("run", help="CMD from the old tree and from this one, alternated")
  r.add_argument("--rounds", type=int, default=2)
  r.add_argument("--grep", default=DEFAULT_GREP, help="a regex: the output lines kept")
  r.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  if args.verb == "prepare": prepare(args.commit)
  else:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command: parser.error("run needs a command after --")
    run(command, args.rounds, args.grep)

if __name__ == "__main__":
  main()
