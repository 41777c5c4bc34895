"""The torch.compile table: per loss and library, what ``benchmarks/compile_report.py`` measured
(``compile*.json``: graphs, breaks, whether ``fullgraph=True`` compiles, recompilations over
fresh batches, cold and warm compile times)."""

from __future__ import annotations

from benchmarks.pages.markdown import Result, machine_of, markdown_table, table_rows

LIBRARIES = ("rlloss", "torchrl")


def compile_cells(row: dict | None) -> list[str]:
    """One library's figures: fullgraph, graphs / breaks, recompiles, cold and warm seconds."""
    if row is None:
        return ["-"] * 4
    if row.get("explain_error"):
        return [f"error: {str(row['explain_error'])[:60]}", "-", "-", "-"]
    fullgraph = "yes" if row.get("fullgraph_ok") else "**no**"
    graphs = f"{row.get('graph_count')} / {row.get('graph_break_count')}"
    cold, warm = row.get("cold_s"), row.get("warm_s")
    seconds = "-" if cold is None else f"{cold:.1f} / {warm:.2f}" if warm else f"{cold:.1f} / -"
    recompiles = row.get("recompiles")
    return [fullgraph, graphs, "-" if recompiles is None else str(recompiles), seconds]


def compile_table(results: list[Result]) -> list[str]:
    """One row per loss, rlloss's figures beside TorchRL's, from the newest file with each (the
    compile report's files: rows with a case and a library; ``compiled_update.json``'s updates
    per second are in docs/guides/compiled-update.md)."""
    found: dict[str, dict[str, dict]] = {}
    sources = []
    for result in sorted(results, key=lambda r: machine_of(r).get("date", "")):
        rows = [r for r in table_rows(result.data) if "case" in r and "library" in r]
        if result.kind != "compile" or not rows:
            continue
        sources.append(f"`{result.path.name}` ({machine_of(result).get('date', '?')[:10]})")
        for row in rows:
            found.setdefault(row["case"], {})[row["library"]] = row
    if not found:
        return ["No compile results in the results dir.", ""]
    rows = [
        [case, *(c for lib in LIBRARIES for c in compile_cells(libs.get(lib)))]
        for case, libs in found.items()
    ]
    header = ["loss"] + [
        f"{lib}: {column}"
        for lib in ("rlloss", "TorchRL")
        for column in ("fullgraph", "graphs / breaks", "recompiles", "cold / warm s")
    ]
    return markdown_table(header, rows) + [f"From {', '.join(sources)}.", ""]
