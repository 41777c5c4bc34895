"""Functions over N code lines (issue 48's guide: 50), longest first.

    python tools/long_functions.py [ROOT=rlloss] [N=50]

Code lines: lines of the function that hold code (not blank, not comment-only, not in a
docstring). Two counts: the whole function (its signature included) and its body (after the
signature), since a public class's ``__init__`` spells out every keyword it accepts.
"""

import ast
import io
import sys
import tokenize
from pathlib import Path

LIMIT = int(sys.argv[2]) if len(sys.argv) > 2 else 50


def code_lines(source: str) -> set[int]:
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def docstring_lines(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                out.update(range(body[0].lineno, body[0].end_lineno + 1))
    return out


root = Path(sys.argv[1] if len(sys.argv) > 1 else "rlloss")
rows = []
for path in sorted(root.rglob("*.py")):
    src = path.read_text()
    tree = ast.parse(src)
    code = code_lines(src) - docstring_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = set(range(node.lineno, node.end_lineno + 1))
            body_start = node.body[0].lineno
            whole = len(span & code)
            body = len(set(range(body_start, node.end_lineno + 1)) & code)
            if whole > LIMIT:
                rows.append((body, whole, f"{path}:{node.lineno}", node.name))
for body, whole, where, name in sorted(rows, reverse=True):
    print(f"{body:4d} body {whole:4d} whole  {where}  {name}")
print(
    f"{len(rows)} functions over {LIMIT} code lines (whole); "
    f"{sum(1 for r in rows if r[0] > LIMIT)} over {LIMIT} in the body"
)
