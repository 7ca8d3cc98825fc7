"""The tables of ``flashlm plan --roofline``: batched prefill per batch, speculative decoding per
number of drafts, each phase on the roofline, and a measured run beside its predictions."""
from __future__ import annotations

from rich.table import Table

PHASE_LABEL = {"embed": "embed", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "output",
               "sampling": "sampling", "pass": "whole pass"}


def _kb(n) -> str:
    return f"{n / 1024:,.1f}"


def print_batches(console, board, quotes, best, T, t_spec, count) -> None:
    t = Table(title=f"batched prefill on {board}: predicted per prompt token over a {count}-token prompt "
                    f"(a prediction from the board profile)", title_justify="left")
    for col in ("batch T", "fits", "RAM placed", "µs / prompt token", "× T=1", "flash KB / tok", "psram KB / tok"):
        t.add_column(col, justify="left" if col == "fits" else "right")
    one = next((q for q in quotes if q.batch == 1 and q.fits), None)
    for q in quotes:
        if not q.fits:
            t.add_row(str(q.batch), "no", "-", "-", "-", "-", "-")
            continue
        mark = " ◀ best" if q is best else ""
        t.add_row(f"{q.batch}{mark}", "yes", " + ".join(f"{_kb(v)} KB {k}" for k, v in q.ram.items() if v),
                  f"{q.us_per_token:,.0f}", f"{one.us_per_token / q.us_per_token:.2f}" if one else "-",
                  _kb(q.bytes_per_token["flash"]), _kb(q.bytes_per_token["psram"]))
    console.print(t)
    console.print(f"best batch the board's RAM allows: T = {best.batch} (the smallest within 5 % of the lowest "
                  f"predicted µs per prompt token); the roofline's pass of several tokens: T = {T}; speculation "
                  f"quoted up to {t_spec - 1} drafts (batch {t_spec})", soft_wrap=True)


def print_speculation(console, board, spec_out, pos, T) -> None:
    for mode, qs in spec_out:
        a = qs[0].acceptance
        t = Table(title=f"speculative decoding with {mode} on {board}, batch {T}, at position {pos}: predicted per "
                        f"emitted token (a prediction), against plain greedy decoding", title_justify="left")
        for col in ("drafts k", "accept p_k", "tokens / verify", "tokens / pass", "verify ÷ plain step",
                    "µs / token", "draft µs / token", "plain µs / token", "× plain tok/s", "flash KB / tok",
                    "psram KB / tok"):
            t.add_column(col, justify="right")
        best = max(qs, key=lambda q: q.speedup)
        for q in qs:
            b = q.bytes_per_token()
            t.add_row(f"{q.k}{' ◀' if q is best else ''}", f"{a.rate(q.k):.2f}", f"{q.tokens_per_verify:.2f}",
                      f"{q.tokens_per_pass:.2f}", f"{q.pass_cost_ratio:.2f}", f"{q.us_per_token:,.0f}",
                      f"{q.draft_us_per_token:,.0f}" if q.draft is not None else "-",
                      f"{q.plain_us_per_token:,.0f}", f"{q.speedup:.2f}", _kb(b["flash"]), _kb(b["psram"]))
        console.print(t)
        ev = (f"; verifications reaching each position: {', '.join(map(str, a.reached))}" if a.reached else "")
        console.print(f"[dim]acceptance: {a.source}; {100 * a.proposed:.0f} % of decoding passes had drafts{ev}. "
                      f"Lookup's search is not costed (µs on the device: the draft phase).[/]", soft_wrap=True)


def print_roofline(console, board, roofs, groups) -> None:
    measured = any(p.measured for _, ps in groups for p in ps)
    t = Table(title=f"{board} roofline: ceilings {roofs.mac_per_s / 1e6:,.1f} M int8 MAC/s and "
                    f"{roofs.flop_per_s / 1e6:,.2f} M float ops/s at {roofs.clock_mhz:g} MHz; roofs "
                    + ", ".join(f"{k} {v / 1e6:,.1f} MB/s" for k, v in roofs.bandwidth.items())
                    + " (board profile; predicted unless marked measured)", title_justify="left")
    cols = ["pass", "phase", "M ops", "binding tier", "KB from it", "ops / B", "roof M ops/s",
            "pred. M ops/s", "pred. µs", "bound"]
    if measured:
        cols += ["meas. µs", "meas. ÷ pred."]
    for c in cols:
        t.add_column(c, justify="left" if c in ("pass", "phase", "binding tier", "bound") else "right")
    for label, ps in groups:
        meas = {p.phase: p for p in ps if p.measured}
        for p in ps:
            if p.measured:
                continue
            ceiling = p.ops / (p.compute_us * 1e-6) if p.compute_us > 0 else roofs.peak
            roof = min(ceiling, roofs.bandwidth[p.tier] * p.intensity)
            row = [label, PHASE_LABEL.get(p.phase, p.phase), f"{p.ops / 1e6:,.2f}", p.tier, _kb(p.tier_bytes),
                   f"{p.intensity:,.2f}", f"{roof / 1e6:,.1f}", f"{p.ops_per_s / 1e6:,.1f}", f"{p.us:,.0f}", p.bound]
            if measured:
                m = meas.get(p.phase)
                row += [f"{m.us:,.0f}", f"{m.us / p.us:.2f}"] if m else ["-", "-"]
            t.add_row(*row)
    console.print(t)


def print_measured(console, run: dict, cats: list[dict]) -> None:
    hello = run.get("hello") or {}
    t = Table(title=f"measured on {hello.get('board')} ({hello.get('clock_name')}) vs predicted at the same "
                    f"positions: per pass", title_justify="left")
    for c in ("passes", "pass", "tokens / pass", "steps / pass", "meas. µs", "pred. µs", "meas. ÷ pred.",
              "draft meas. µs", "draft pred. µs", "bytes = predicted"):
        t.add_column(c, justify="left" if c == "pass" else "right")
    for c in cats:
        n = c["passes"]
        meas = sum(v for k, v in c["us"].items() if k != "draft") / n
        pred = c["pred"].total_us / n
        dm = c["us"].get("draft", 0) / n
        dp = c["draft"].total_us / n if c["draft"] is not None else None
        t.add_row(str(n), c["label"], f"{c['tokens'] / n:.2f}", f"{c['steps'] / n:.2f}", f"{meas:,.0f}",
                  f"{pred:,.0f}", f"{meas / pred:.2f}" if pred else "-", f"{dm:,.0f}" if dm else "-",
                  f"{dp:,.0f}" if dp is not None else "-", "yes" if c["bytes_equal"] else "NO")
    console.print(t)
