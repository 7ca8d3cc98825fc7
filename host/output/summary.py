"""The end-of-run summary: per-phase p50/p95/mean of prefill and decode steps, tok/s, bytes per
token per tier, forward passes, the experts read (a mixture of experts), the emulator harness's
counts, the golden check, link losses."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..link.messages import TIERS
from ..session.result import RunResult
from .experts import summary_lines as expert_lines
from .labels import fmt, phase_header, shown_phases, where
from .stats import summarize

def summary_renderables(result: RunResult) -> list:
    s = summarize(result)
    at = where(result)
    u = s["unit"]
    out = []
    table = Table(title=f"device {u} per step — {at}", title_justify="left")
    table.add_column("phase", no_wrap=True)
    for grp in ("prefill", "decode"):
        table.add_column(f"{grp} steps (n={s[grp]['steps']})\np50 / p95 / mean", justify="right", no_wrap=True)
    for name in shown_phases(result.tokens) + ["total"]:
        label = phase_header(name, result.clock)
        cells = []
        for grp in ("prefill", "decode"):
            ph = s[grp]["phases"][name]
            cells.append(f"{fmt(ph['p50'])} / {fmt(ph['p95'])} / {fmt(ph['mean'], 1)}")
        table.add_row(label, *cells, style="bold" if name == "total" else None)
    table.add_row("head rows (% of out_vocab)", *[_rows_cell(s[grp]["head_rows"]) for grp in ("prefill", "decode")])
    out.append(table)

    lines = []
    tps = s["tokens_per_s"]
    gen_us = s["decode"]["phases"]["total"]["sum"]
    draft_us = s["decode"]["phases"]["draft"]["sum"]
    lines.append(f"decode: {s['generated_tokens']} tokens in {gen_us:,} {u} "
                 + ("of device time" if u == "µs" else "run on the device")
                 + (f" (drafting {draft_us:,} {u})" if draft_us else "")
                 + _rate_text(tps, gen_us, s["generated_tokens"], u) + f"  [{at}]")
    pps = s["prefill_tok_per_s"]
    if s["prefill"]["steps"]:
        pre_us = s["prefill"]["phases"]["total"]["sum"]
        lines.append(f"prefill: {s['prefill']['steps']} prompt tokens in {pre_us:,} {u}"
                     + _rate_text(pps, pre_us, s["prefill"]["steps"], u) + f"  [{at}]")
    for grp in ("prefill", "decode"):
        b = s[grp]["bytes"]
        if b["flash"] is not None:
            lines.append(f"bytes read per {grp} token: "
                         + ", ".join(f"{tier} {b[tier]:,.0f}" for tier in TIERS) + f"  [{at}]")
    lines += pass_lines(s["passes"], at, u)
    lines += expert_lines(s["experts"])
    h = s.get("harness")
    if h is not None:
        hb, eb = h["harness_bytes_per_token"], h["engine_bytes_per_token"]
        pad = h["padding_per_token"]
        lines.append("emulator harness, bytes the core read per decode token: "
                     + ", ".join(f"{tier} {hb[tier]:,.0f} (engine {eb[tier]:,.0f})" for tier in TIERS
                                 if hb[tier] is not None and eb[tier] is not None)
                     + (f" — agree on {h['agree_steps']}/{h['steps']} steps" if h["compared_steps"] else
                        " — not compared: which padded rows of the draft model each pass read is not reported")
                     + (" less the row padding the engine counts and no kernel loads ("
                        + ", ".join(f"{tier} {pad[tier]:,.0f}" for tier in TIERS if pad[tier]) + " a decode token)"
                        if pad and any(pad.values()) else ""))
        x = h["xip_per_token"]
        if x is not None:
            lines.append(f"XIP cache per decode token: p50 {fmt(x['hits']['p50'])} hits, {fmt(x['misses']['p50'])} "
                         f"misses ({fmt(x['fetch_misses']['p50'])} of them instruction fetches) stalling "
                         f"{fmt(x['stall_cycles']['p50'])} cycles = {x['stall_share'] * 100:.1f} % of the token "
                         f"(one miss {x['miss_cycles']} cycles)")
        d = h.get("ssi_per_token")
        if d is not None:
            lines.append(f"SSI direct reads per decode token (weights streamed into SRAM under compute): p50 "
                         f"{fmt(4 * d['words']['p50'])} flash bytes = {d['flash_share'] * 100:.1f} % of the "
                         f"token's, holding the QSPI bus {fmt(d['cycles']['p50'])} cycles = "
                         f"{d['bus_share'] * 100:.1f} % of the token's cycles")
        lines.append(f"emulated cycles per decode token: p50 {fmt(h['cycles_per_token']['p50'])} "
                     f"({fmt(h['emulated_us_per_token']['p50'])} µs emulated, XIP model "
                     f"{'on' if x is not None else 'off'}); emulator wall time per token: "
                     f"p50 {fmt(h['wall_ms_per_token']['p50'], 1)} ms (host clock)")
    if s["device_total_us"] is not None:
        lines.append(f"device total (DONE): {s['device_total_us']:,} {u}, stop reason {s['reason']}  [{at}]")
    lines.append(f"host wall time: {s['host_wall_s']:.3f} s (host clock, includes the serial link)")
    out.extend(Text(line) for line in lines)
    if s["stack"] is not None:
        out.append(stack_line(s["stack"]))
    if result.hello is not None:
        out.append(bit_exact_line(result.hello))
    if h is not None and h["mismatch_steps"]:
        out.append(Text(f"harness and engine byte counters differ on step(s) {h['mismatch_steps'][:20]}",
                        style="bold yellow"))
    if s.get("timing_note"):
        out.append(Text(f"note: {s['timing_note']}", style="dim"))
    if s["missing_steps"] or s["frame_gaps"] or s["bad_frames"]:
        steps = s["missing_steps"]
        shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
        out.append(Text(f"link: {len(steps)} step(s) lost [{shown or 'none'}], {s['frame_gaps']} seq gap(s), "
                        f"{s['bad_frames']} bad frame(s) — numbers above cover the steps that arrived",
                        style="bold yellow"))
    if result.interrupted:
        out.append(Text("interrupted: STOP sent, showing what arrived", style="yellow"))
    return out


def _rate_text(per_s, total, n: int, u: str) -> str:
    """" = 12.3 tok/s" from device time; from an instruction count (no time) the count a token."""
    if per_s:
        return f" = {per_s:,.2f} tok/s"
    return f" = {total / n:,.0f} {u} a token" if u != "µs" and n else ""


def pass_lines(pa: dict, at: str, u: str = "µs") -> list[str]:
    """The summary's lines on forward passes: prefill chunks, and speculative decoding (figures in
    the board clock's unit ``u``)."""
    out = []
    pre, dec = pa["prefill"], pa["decode"]

    def tiers(b):
        return ", ".join(f"{tier} {b[tier]:,.0f}" for tier in TIERS if b[tier])
    if pre["passes"] and pre["tokens"] > pre["passes"]:
        out.append(f"prefill in {pre['passes']} pass{'es' * (pre['passes'] != 1)} of {pre['tokens_per_pass']:.1f} tokens "
                   f"(up to {pa['batch']}): {pre['us_per_pass']:,.0f} {u} and {tiers(pre['bytes_per_pass'])} "
                   f"bytes per pass; per prompt token {pre['us_per_token']:,.0f} {u}, {tiers(pre['bytes_per_token'])} "
                   f"bytes  [{at}]")
    if dec["verify_passes"]:
        out.append(f"speculative decoding ({pa['speculate']}): {dec['accepted']}/{dec['drafted']} drafts accepted "
                   f"({100 * dec['acceptance']:.0f} %), {dec['tokens_per_verify_pass']:.2f} tokens per verifying "
                   f"pass, {dec['tokens_per_pass']:.2f} per decode pass; per emitted token {dec['us_per_token']:,.0f} {u} "
                   f"(drafting {dec['draft_us_per_token']:,.0f}) and {tiers(dec['bytes_per_token'])} bytes"
                   + (f" (drafting {tiers(dec['draft_bytes_per_token']) or '0'})" if dec["draft_bytes_per_token"] else "")
                   + f"  [{at}]")
    return out


def stack_line(st: dict) -> Text:
    """The main stack's deepest use since boot (the board paints it at reset): loud when the paint is
    gone, as then the stack ran into the RAM below it (the KV cache, the arena)."""
    peak, size = st["peak"], st["size"]
    if peak >= size:
        return Text(f"stack: all {size:,} B of the main stack used since boot — it may have overflowed into the "
                    f"RAM below it (KV cache, arena): results after that are not to be trusted", style="bold red")
    return Text(f"stack: deepest {peak:,} B of the main stack's {size:,} B since boot ({100 * peak / size:.0f} %; "
                f"{size - peak:,} B never touched)  [board's own measure: stack painted at reset]")


def bit_exact_line(hello):
    """The board's golden check as one line: loud when it is not bit-exact with the reference."""
    style = {"exact": "green", "differs": "bold red"}.get(hello.golden, "yellow")
    return Text(f"bit-exact with the reference: {hello.bit_exact}  [board {hello.board}]", style=style)


def _rows_cell(h: dict) -> str:
    if h["mean"] is None:
        return "–"
    pct = f" ({h['pct_of_out_vocab']:.1f} %)" if h["pct_of_out_vocab"] is not None else ""
    return f"{h['mean']:,.1f}{pct}"


def print_summary(console, result: RunResult) -> None:
    for r in summary_renderables(result):
        console.print(r, soft_wrap=isinstance(r, Text))
