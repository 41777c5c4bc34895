"""The torch.compile page: per case and library, whatever the compile report measured (graphs,
breaks, fullgraph, recompiles, cold and warm compile times)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.pages.markdown import (
    Result,
    cell,
    command_of,
    markdown_table,
    method_lines,
    rel,
    table_rows,
)


def flatten(row: dict) -> dict[str, Any]:
    """A row with nested dicts flattened one level (``a.b``)."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def generic_table(rows: list[dict]) -> list[str]:
    """Every key of the rows as a column, in order of first appearance; keys with one value in
    every row are stated once above the table instead."""
    flat = [flatten(r) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    constant = [c for c in columns if len(rows) > 1 and len({cell(r.get(c)) for r in flat}) == 1]
    lines = [f"Every row: {', '.join(f'{c} = {cell(flat[0].get(c))}' for c in constant)}.", ""]
    columns = [c for c in columns if c not in constant]
    return (lines if constant else []) + markdown_table(
        columns, ([r.get(c) for c in columns] for r in flat)
    )


def compile_section(result: Result, device: str, out: Path) -> list[str]:
    """The compile table of one file's rows on one device, one table per case when the rows
    name their case."""
    lines = [f"### torch.compile on {device} (`{rel(result.path, out)}`)", ""]
    if result.error:
        return lines + [f"Skipped: `{result.path.name}` {result.error}.", ""]
    rows = [r for r in table_rows(result.data) if str(r.get("device", "cpu")) == device]
    lines += [f"Command: `{command_of(result)}`", ""]
    data = result.data if isinstance(result.data, dict) else {}
    lines += method_lines(data)
    if not rows:
        return lines + ["No rows.", ""]
    rows = [{k: v for k, v in r.items() if k != "device"} for r in rows]
    if not all("case" in r for r in rows):
        return lines + generic_table(rows)
    for case in dict.fromkeys(r["case"] for r in rows):
        case_rows = [{k: v for k, v in r.items() if k != "case"} for r in rows if r["case"] == case]
        lines += [f"#### {case} (compile)", ""]
        description = case_rows[0].get("description")
        if description and all(r.get("description") == description for r in case_rows):
            case_rows = [{k: v for k, v in r.items() if k != "description"} for r in case_rows]
            lines += [f"_{description}_", ""]
        lines += generic_table(case_rows)
    return lines
