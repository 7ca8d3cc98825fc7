"""The statistics of a run: per-phase percentiles of its steps, rates, forward passes, and the
emulator harness's counts beside the engine's.

Every number comes from the device's own per-phase µs (TOKEN frames), never from the host's
wall clock, and is printed together with the board name and the clock source the HELLO named
("host clock", "chip timer", "emulated timer", "emulated instructions").  Host wall time is
reported once, labelled. Under "emulated instructions" (the QEMU boards) the TOKEN's "µs" fields
count instructions, not time: the rates (tok/s) are None there, and the unit says so.

Step kinds: a *prefill* step is a prompt step whose output is unused (out_id None: by default
the device skips its output layer); a *decode* step produced a token (the last prompt step and
every later one), so "decode tok/s" is the generated tokens divided by the device time of the
steps that produced them, and "prefill tok/s" the prompt tokens run per second of prefill time.
Each group reports the output-layer rows its steps computed (TOKEN head_rows), as a share of
out_vocab: 0 for a skipped head, below 100 % for a pruned greedy scan.

Forward passes (protocol version 3, docs/formats.md section 2.4): the prompt runs in chunks of up to
the batch and drafted tokens are verified several at a time, so a TOKEN's µs and bytes are those of
the whole pass it came from, repeated in each step the pass produced. Per-step figures here are a
step's share of its pass (the pass's figures divided by its steps: session.result.step_share), so every
sum counts each pass once; ``passes`` summarizes the passes themselves (per chunk µs and bytes,
bytes per prompt token, acceptance of drafts).
"""
from __future__ import annotations

from ..link.messages import PHASES, TIERS
from ..session.result import RunResult, step_share
from .experts import expert_summary
from .labels import INSTRUCTION_CLOCK, unit

def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]; None when empty."""
    v = sorted(float(x) for x in values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def step_total(tok) -> float:
    """A step's µs: its share of its forward pass's (all of it for a pass of one token)."""
    return sum(step_share(tok)["us"])


def group_stats(tokens, out_vocab: int | None = None) -> dict:
    """p50/p95/mean per phase and of the step total, mean bytes per tier, and the output-layer rows
    computed (mean, and % of out_vocab when known), for some steps (each its share of its pass)."""
    out: dict = {"steps": len(tokens), "phases": {}, "bytes": {}}
    shares = [step_share(t) for t in tokens]
    cols = {p: [sh["us"][i] for sh in shares] for i, p in enumerate(PHASES)}
    cols["total"] = [sum(sh["us"]) for sh in shares]
    for name, vals in cols.items():
        out["phases"][name] = {"p50": percentile(vals, 50), "p95": percentile(vals, 95),
                               "mean": (sum(vals) / len(vals)) if vals else None,
                               "sum": round(sum(vals))}
    for i, tier in enumerate(TIERS):
        vals = [sh["bytes"][i] for sh in shares]
        out["bytes"][tier] = (sum(vals) / len(vals)) if vals else None
    rows = [t.head_rows for t in tokens]
    mean = sum(rows) / len(rows) if rows else None
    out["head_rows"] = {"mean": mean, "p50": percentile(rows, 50), "max": max(rows) if rows else None,
                        "pct_of_out_vocab": 100.0 * mean / out_vocab if mean is not None and out_vocab else None}
    return out


def _rate(n: int, us: int, clock: str | None = None) -> float | None:
    """Tokens a second of device time; None without time (no steps, or an instruction count)."""
    return n / (us / 1e6) if n and us > 0 and clock != INSTRUCTION_CLOCK else None


EMULATED_NOTE = ("the emulated timer advances with rp2040js's instruction cycle counts plus the stalls of "
                 "the harness's XIP model (16 KB 2-way XIP cache, one QSPI line transfer per miss at the "
                 "SSI settings the firmware wrote: host/emu/xip.mjs); weights the firmware streams come by "
                 "the SSI's direct quad reads at the rate its registers give (host/emu/ssidirect.mjs)")
EMULATED_NOTE_NO_XIP = ("the emulated timer advances with rp2040js's instruction cycle counts; this run had "
                        "the XIP model off (--xip-model off), so a flash read cost what an SRAM read costs and "
                        "flash-read time is a lower bound")
XIP_FIELDS = ("hits", "misses", "fetch_misses", "stall_cycles")


def harness_rows(result: RunResult) -> list[dict]:
    """Per forward pass the emulator harness measured (its marks name the pass's first step, and cover
    proposing its drafts): its counts of the bytes the core read per tier beside the engine's own
    counters from the pass's first TOKEN frame and the row padding the engine counts but no kernel
    loads (``agree``: the engine's less the padding equal the harness's; None: not compared), plus
    cycles, emulated µs and host ms, the steps the pass produced and (XIP model on) the pass's XIP
    cache hits, misses (line transfers; fetch_misses of them instruction fetches), the cycles they
    stalled the core and the cycles one miss costs, and (a step with a streamed product) the words the
    SSI's direct reads moved and the cycles they held the QSPI bus (``ssi``, else None)."""
    by = {int(r["step"]): r for r in result.harness if "step" in r}
    rows = []
    for t in sorted(result.tokens, key=lambda t: t.step):
        h = by.get(int(t.step))
        if h is None or t.chunk != t.step:
            continue
        hb = [int(b) for b in h.get("bytes", [])]
        eb = [int(b) for b in t.bytes_read]
        # like with like: the engine's counts less the padding it counts and no kernel loads
        pads = None if result.padding is None else result.padding.get(int(t.step), [[0] * len(TIERS)])
        pad = None if pads is None else next((p for p in pads if [e - q for e, q in zip(eb, p)] == hb), pads[0])
        rows.append({"step": int(t.step), "kind": "prefill" if t.out_id is None else "decode",
                     "pass": t.kind, "tokens": t.chunk_len, "steps": t.chunk_used,
                     "engine_bytes": dict(zip(TIERS, eb)),
                     "harness_bytes": dict(zip(TIERS, hb)),
                     "padding_bytes": None if pad is None else dict(zip(TIERS, pad)),
                     "agree": None if pad is None else [e - q for e, q in zip(eb, pad)] == hb,
                     "cycles": int(h.get("cycles", 0)), "emulated_us": float(h.get("us", 0.0)),
                     "wall_ms": float(h.get("wall_ms", 0.0)),
                     "xip": {k: int(v) for k, v in h["xip"].items()} if h.get("xip") else None,
                     "ssi": {k: int(h["ssi"][k]) for k in ("words", "cycles")} if h.get("ssi") else None})
    return rows


def harness_summary(result: RunResult) -> dict | None:
    """Agreement of the harness's per-region read counts with the engine's, and per-token cost on
    the emulator (decode passes, per step they produced); None when the run had no harness (not an
    emulated board)."""
    if not result.harness:
        return None
    rows = harness_rows(result)
    gen = [r for r in rows if r["kind"] == "decode"] or rows

    def stats(vals):
        return {"p50": percentile(vals, 50), "mean": (sum(vals) / len(vals)) if vals else None}

    xg = [r for r in gen if r["xip"]]
    xip = None
    if xg:
        xip = {k: stats([r["xip"][k] / r["steps"] for r in xg]) for k in XIP_FIELDS}
        xip["miss_cycles"] = xg[-1]["xip"]["miss_cycles"]
        xip["stall_share"] = sum(r["xip"]["stall_cycles"] for r in xg) / max(1, sum(r["cycles"] for r in xg))
    ssi = None
    if any(r["ssi"] for r in gen):       # the firmware streamed weights by the SSI's direct reads
        none = {"words": 0, "cycles": 0}
        ssi = {k: stats([(r["ssi"] or none)[k] / r["steps"] for r in gen]) for k in ("words", "cycles")}
        ssi["flash_share"] = (4 * sum((r["ssi"] or none)["words"] for r in gen)
                              / max(1, sum(r["harness_bytes"][TIERS[0]] for r in gen)))
        ssi["bus_share"] = sum((r["ssi"] or none)["cycles"] for r in gen) / max(1, sum(r["cycles"] for r in gen))
    n = sum(r["steps"] for r in gen)
    padded = [r for r in gen if r["padding_bytes"] is not None]
    return {"steps": len(rows), "agree_steps": sum(r["agree"] is True for r in rows),
            "mismatch_steps": [r["step"] for r in rows if r["agree"] is False],
            "compared_steps": sum(r["agree"] is not None for r in rows),
            "padding_per_token": {tier: sum(r["padding_bytes"][tier] for r in padded)
                                  / sum(r["steps"] for r in padded) for tier in TIERS} if padded else None,
            "cycles_per_token": stats([r["cycles"] / r["steps"] for r in gen]),
            "emulated_us_per_token": stats([r["emulated_us"] / r["steps"] for r in gen]),
            "wall_ms_per_token": stats([r["wall_ms"] / r["steps"] for r in gen]),
            "harness_bytes_per_token": {tier: (sum(r["harness_bytes"][tier] for r in gen) / n) if n else None
                                        for tier in TIERS},
            # the engine's counters over the same passes
            "engine_bytes_per_token": {tier: (sum(r["engine_bytes"][tier] for r in gen) / n) if n else None
                                       for tier in TIERS},
            "xip_per_token": xip, "ssi_per_token": ssi}


def forward_passes(tokens) -> list[dict]:
    """The forward passes of a run, from the TOKEN frames that arrived (a pass's TOKENs share its
    first step and figures): kind, first step, tokens run, steps produced (and how many of those
    arrived), its prompt steps, µs per phase (proposing its drafts: "draft"), bytes per tier."""
    groups: dict = {}
    for t in sorted(tokens, key=lambda t: t.step):
        key = (t.chunk, t.chunk_len, t.chunk_used, t.kind, tuple(t.us), tuple(t.bytes_read))
        groups.setdefault(key, []).append(t)
    out = []
    for (first, n, used, kind, us, nbytes), ts in groups.items():
        out.append({"first": first, "kind": kind, "tokens": n, "steps": used, "steps_seen": len(ts),
                    "prompt_steps": sum(t.out_id is None for t in ts),
                    "us": dict(zip(PHASES, us)), "total_us": sum(us), "bytes": dict(zip(TIERS, nbytes))})
    return out


def pass_summary(result: RunResult) -> dict:
    """Prefill and decoding by forward pass: the prompt's passes (per pass µs and bytes, and per
    prompt token), and the passes after it (acceptance of drafts, tokens per verifying pass, µs and
    bytes per emitted token with drafting included; drafting's own share of the bytes from DONE)."""
    ps = forward_passes(result.tokens)
    pre = [p for p in ps if p["prompt_steps"]]          # passes that ran prompt tokens
    dec = [p for p in ps if not p["prompt_steps"]]      # every step they produced is a generated token
    ver = [p for p in dec if p["kind"] == "verify"]
    n_pre = sum(p["tokens"] for p in pre)
    emitted = sum(p["steps"] for p in dec)

    def per(items, n, key):
        return {tier: (sum(p[key][tier] for p in items) / n if n else None) for tier in TIERS}
    drafted, accepted = sum(p["tokens"] - 1 for p in ver), sum(p["steps"] - 1 for p in ver)
    dec_us = sum(p["total_us"] for p in dec)
    done = result.done
    return {
        "batch": result.request.batch or (result.hello.batch if result.hello is not None else None),
        "speculate": result.request.speculate, "draft_k": result.request.draft_k,
        "prefill": {"passes": len(pre), "tokens": n_pre,
                    "tokens_per_pass": n_pre / len(pre) if pre else None,
                    "us_per_pass": sum(p["total_us"] for p in pre) / len(pre) if pre else None,
                    "us_per_token": sum(p["total_us"] for p in pre) / n_pre if n_pre else None,
                    "bytes_per_pass": per(pre, len(pre), "bytes"),
                    "bytes_per_token": per(pre, n_pre, "bytes"),
                    "chunks": [{"first": p["first"], "tokens": p["tokens"], "us": p["total_us"], "bytes": p["bytes"]}
                               for p in pre]},
        "decode": {"passes": len(dec), "emitted": emitted, "verify_passes": len(ver),
                   "drafted": drafted, "accepted": accepted,
                   "acceptance": accepted / drafted if drafted else None,
                   "tokens_per_verify_pass": sum(p["steps"] for p in ver) / len(ver) if ver else None,
                   "tokens_per_pass": emitted / len(dec) if dec else None,
                   "us_per_token": dec_us / emitted if emitted else None,
                   "tok_per_s": _rate(emitted, dec_us, result.clock),
                   "draft_us_per_token": sum(p["us"]["draft"] for p in dec) / emitted if emitted else None,
                   "bytes_per_token": per(dec, emitted, "bytes"),
                   "draft_bytes_per_token": ({tier: b / emitted for tier, b in zip(TIERS, done.draft_bytes)}
                                             if done is not None and emitted and not result.done_from_host else None)},
    }


def summarize(result: RunResult) -> dict:
    hello = result.hello
    prompt, gen = result.prompt_steps, result.generated_steps
    out_vocab = hello.out_vocab if hello is not None else None
    ps, gs = group_stats(prompt, out_vocab), group_stats(gen, out_vocab)
    gen_us = gs["phases"]["total"]["sum"]
    prompt_us = ps["phases"]["total"]["sum"]
    done = result.done
    harness = harness_summary(result)
    return {
        "board": result.board,
        "clock": result.clock,
        "fw_version": hello.fw_version if hello is not None else None,
        "model_hash": bytes(hello.model_hash).hex() if hello is not None else None,
        "layout_id": hello.layout_id if hello is not None else None,
        "bit_exact": hello.bit_exact if hello is not None else None,
        "prompt_tokens": len(result.prompt_ids),
        "steps_received": len(result.tokens),
        "generated_tokens": len(gen),
        "reason": done.reason if done is not None else ("interrupted" if result.interrupted else "incomplete"),
        "interrupted": result.interrupted,
        "missing_steps": list(result.missing_steps),
        "duplicate_steps": list(result.duplicate_steps),
        "frame_gaps": result.frame_gaps,
        "bad_frames": result.bad_frames,
        "out_vocab": out_vocab,
        "flags": {"slide": bool(result.request.slide), "all_logits": bool(result.all_logits)},
        "prefill": ps,
        "decode": gs,
        # device time only: generated tokens over the µs of the steps that produced them (drafting included)
        "tokens_per_s": _rate(len(gen), gen_us, result.clock),
        "prefill_tok_per_s": _rate(len(prompt), prompt_us, result.clock),
        "unit": unit(result.clock),
        "bytes_per_token": gs["bytes"],
        "device_total_us": int(done.total_us) if done is not None else None,
        # the board's own measure (a stack painted at reset); None where it does not measure it
        "stack": ({"peak": done.stack_peak, "size": done.stack_size}
                  if done is not None and done.stack_size else None),
        "device_steps_us": int(sum(step_total(t) for t in result.tokens)),
        "host_wall_s": result.wall_s,
        "passes": pass_summary(result),
        "experts": expert_summary(result.tokens),
        "harness": harness,
        "timing_note": timing_note(result.clock, harness),
    }


INSTRUCTIONS_NOTE = ("the emulated instructions are QEMU's exact count of the instructions the firmware ran "
                     "(-icount): the instruction set's cost with this compiler, with no cache, flash or PSRAM "
                     "timing and no pipeline; not cycles, and not the chip's µs")


def timing_note(clock: str, harness: dict | None) -> str | None:
    """What an emulated clock counts (the RP2040's timer with or without the XIP model, QEMU's
    instructions); None for other clocks."""
    if clock == INSTRUCTION_CLOCK:
        return INSTRUCTIONS_NOTE
    if clock != "emulated timer":
        return None
    return EMULATED_NOTE if harness is None or harness["xip_per_token"] else EMULATED_NOTE_NO_XIP
