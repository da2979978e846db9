"""``swapcheck kernels``: the kernel registry."""

from __future__ import annotations

import typer

from orchestrator.cli.common import FormatOpt, TableFormat, emit_rows, user_errors

app = typer.Typer(help="Kernels swapcheck can run (built-ins, entry points, module:attr).", no_args_is_help=True)


@app.command("list")
def list_(
    fmt: FormatOpt = TableFormat.table,
    all_: bool = typer.Option(True, "--all/--available", help="Show unavailable kernels too (with the reason)."),
    long: bool = typer.Option(False, "--long", "-l", help="Add each kernel's formula (always in JSON)."),
) -> None:
    """Show each kernel's name, operand dtype, device, availability and, when unavailable, why.

    Example: swapcheck kernels list --format json
    """
    with user_errors():
        from tasks.kernels import list_kernels

        rows = [
            {"name": k["name"], "operands": k["operand_dtype"], "device": k["device"],
             "available": "yes" if k["available"] else "no", "reason": k.get("reason") or "",
             **({"description": k.get("description", "")} if long or fmt is TableFormat.json else {})}
            for k in list_kernels()
            if all_ or k["available"]
        ]
        if fmt is TableFormat.json:
            for r in rows:
                r["available"] = r["available"] == "yes"
        emit_rows(rows, fmt, title="kernels")
