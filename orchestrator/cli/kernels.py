"""``swapcheck kernels``: the kernel registry."""

from __future__ import annotations

import typer

from orchestrator.cli.common import FormatOpt, TableFormat, emit_rows, user_errors

app = typer.Typer(help="Kernels swapcheck can run (built-ins, entry points, module:attr).", no_args_is_help=True)


@app.command("list")
def list_(
    fmt: FormatOpt = TableFormat.table,
    all_: bool = typer.Option(True, "--all/--available", help="Show unavailable kernels too (with the reason)."),
    long: bool = typer.Option(False, "--long", "-l", help="Add each kernel's formula and the code path it takes on this CPU (always in JSON)."),
) -> None:
    """Show each kernel's name, operand dtype, device, availability and a note: why it is not
    available, or what to know although it runs here (a native path that is not exact on this CPU,
    or one on a slow reference fallback). The title names the CPU and its ISA level.

    Example: swapcheck kernels list --format json
    """
    with user_errors():
        from tasks.devices import cpu_model, isa_level
        from tasks.kernels import list_kernels

        json_ = fmt is TableFormat.json
        rows = [
            {"name": k["name"], "operands": k["operand_dtype"], "device": k["device"],
             "available": k["available"] if json_ else ("yes" if k["available"] else "no"),
             # JSON: both fields; a table: one note column, why not or what to know although it runs
             **({"reason": k.get("reason") or "", "caveat": k.get("caveat")} if json_
                else {"note": k.get("reason") or k.get("caveat") or ""}),
             **({"description": k.get("description", ""), "code_path": k.get("code_path")} if long or json_ else {})}
            for k in list_kernels()
            if all_ or k["available"]
        ]
        emit_rows(rows, fmt, title=f"kernels on {cpu_model()} (ISA level {isa_level()})")


@app.command("attention")
def attention(
    fmt: FormatOpt = TableFormat.table,
    all_: bool = typer.Option(True, "--all/--available", help="Show unavailable attention kernels too (with the reason)."),
    long: bool = typer.Option(False, "--long", "-l", help="Add each kernel's description (always in JSON)."),
) -> None:
    """Show each attention kernel (docs/attention.md): name, device, availability and why not, how its
    logsumexp comes about, the vLLM backend it selects, and the algorithm whose bounds it is held to.

    Example: swapcheck kernels attention --available
    """
    with user_errors():
        from tasks.attention import list_attention

        rows = [
            {"name": k["name"], "device": k["device"], "available": "yes" if k["available"] else "no",
             "reason": k.get("reason") or "", "logsumexp": k.get("logsumexp") or "",
             "vllm backend": k.get("engine_backend") or "", "algorithm": k.get("algorithm") or "",
             **({"description": k.get("description", "")} if long or fmt is TableFormat.json else {})}
            for k in list_attention()
            if all_ or k["available"]
        ]
        if fmt is TableFormat.json:
            for r in rows:
                r["available"] = r["available"] == "yes"
        emit_rows(rows, fmt, title="attention kernels")


@app.command("quantizers")
def quantizers(
    fmt: FormatOpt = TableFormat.table,
    all_: bool = typer.Option(True, "--all/--available", help="Show quantizers that cannot be built with their defaults too (with the reason)."),
    long: bool = typer.Option(False, "--long", "-l", help="Add each quantizer's summary, parameters and version (always in JSON)."),
) -> None:
    """Show each activation quantizer (docs/quantizers.md): name, output dtype, its exact formula,
    whether it can be built with its defaults and, when not, why (a static entry needs `static_scale`).

    Example: swapcheck kernels quantizers --format json
    """
    with user_errors():
        from tasks.quantizers import list_quantizers

        rows = [
            {"name": q["name"], "output": q["out_dtype"] or "", "available": "yes" if q["ok"] else "no",
             "reason": q["reason"] or "", "formula": q["formula"] or "",
             **({"summary": q["summary"], "params": q["params"], "version": q["version"]}
                if long or fmt is TableFormat.json else {})}
            for q in list_quantizers()
            if all_ or q["ok"]
        ]
        if fmt is TableFormat.json:
            for r in rows:
                r["available"] = r["available"] == "yes"
        elif long:
            for r in rows:
                r["params"] = ", ".join(f"{k}={v}" for k, v in sorted(r["params"].items()))
        emit_rows(rows, fmt, title="activation quantizers")
