"""Lines of code in tgrad/, per file and per folder, largest first, with totals: a size budget to watch.

A line counts when it holds code: blank lines, comments and docstrings (module, class and function) do not count.
Usage: python sz.py [FOLDER] (default: tgrad next to this file).
"""
import ast, io, os, sys, tokenize
from collections import defaultdict
from pathlib import Path

NOT_CODE_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                   tokenize.ENCODING, tokenize.ENDMARKER}
DOCSTRING_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

def docstring_lines(tree: ast.AST) -> set[int]:
  lines: set[int] = set()
  for node in ast.walk(tree):
    if isinstance(node, DOCSTRING_OWNERS) and node.body and isinstance(node.body[0], ast.Expr) \
        and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
      lines.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
  return lines

def code_lines(source: str) -> int:
  try: return _code_lines(source)
  except (SyntaxError, tokenize.TokenError):  # a file mid-edit: count non-blank lines that are not comments
    return sum(1 for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#"))

def _code_lines(source: str) -> int:
  lines: set[int] = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type not in NOT_CODE_TOKENS: lines.update(range(token.start[0], token.end[0] + 1))
  return len(lines - docstring_lines(ast.parse(source)))

def main(root: Path) -> None:
  per_file = {path: code_lines(path.read_text()) for path in sorted(root.rglob("*.py"))}
  per_folder: dict[Path, int] = defaultdict(int)
  for path, count in per_file.items(): per_folder[path.parent] += count
  base = root.parent
  def show(path: Path) -> str: return os.path.relpath(path, base)
  width = max([len(show(p)) for p in [*per_file, *per_folder]], default=10) + 2
  print(f"{'file':<{width}} lines")
  for path, count in sorted(per_file.items(), key=lambda item: (-item[1], str(item[0]))):
    print(f"{show(path):<{width}} {count:5d}")
  print(f"\n{'folder':<{width}} lines  files")
  for folder, count in sorted(per_folder.items(), key=lambda item: (-item[1], str(item[0]))):
    files = sum(1 for path in per_file if path.parent == folder)
    print(f"{show(folder) + '/':<{width}} {count:5d}  {files:5d}")
  print(f"\n{'total':<{width}} {sum(per_file.values()):5d}  {len(per_file):5d}")

if __name__ == "__main__":
  main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "tgrad")
