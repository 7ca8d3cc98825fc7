"""``python -m bench.speed``: what the engine's speed work does on the shipped model
(models/default), measured in one run and printed, never asserted.

* native board (host clock) and emulated RP2040 (emulated timer, rp2040js cycle counts): output
  phase µs per decode token with the whole head (GENERATE flag ALL_LOGITS) and with the greedy
  tile scan (the model as ``flashlm convert`` makes it, with its head index), and the share of
  head rows the scan visits on a real prompt (bench/headindex.py sets the index against no index
  on every shipped model);
* prefill of a ~20-token prompt: device µs of its prefill steps with the head (ALL_LOGITS: what
  every prompt step did before) and without it (the default);
* the int8 KV cache (switched by LAYOUT): attention µs per decode token beside the f32 cache, KV
  bytes stored per position and KV bytes read per decode token (the engine's own counters);
* the int4 head (``--quant head=q4``): output µs, flash bytes per token, rows visited;
* quality through the NumPy reference: eval loss and perplexity on the held-out text
  (models/default/eval.txt) with an f32 vs int8 KV cache and a q8 vs q4 head, over the first
  ``--eval-windows`` 128-token windows (the reference runs ~30 ms a token; the whole text is 502
  windows).

``--json FILE`` writes the figures. Timings come from the firmware's clock; each line names it.
``--short`` is what ``make bench`` runs: the whole vs greedy head, the prefill and the KV cache
figures of the q8 model only, with fewer tokens, and no eval.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from converter import evaluate
from converter.footprint import kv_position_bytes
from converter.tokenizer import encode
from host.commands.run import kv_layout
from host.link.messages import Generate
from host.boards.emulated import start_emulated_board
from host.boards.native import start_native_board

from .model import MODEL, PROMPT, ROOT, blob_and_firmware, converted, default_ir, default_quant, session

PREFILL_PROMPT = "HAMLET.\nTo be, or not to be, that is the question:"      # 23 tokens with <|bos|>
OUT, ATTN, SAMPLE = 4, 1, 5      # phase indices (host.link.messages.PHASES)


def _median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def fastest(runs, f, first: int = 0) -> list:
    """Per generated step (from the ``first``), ``f`` of that step in the fastest of the ``runs``
    (the same generation repeated): a busy host only ever adds time, so the minimum over rounds is
    the estimate least disturbed by other processes."""
    return [min(col) for col in zip(*[[f(t) for t in r.generated_steps[first:]] for r in runs])]


def board_figures(board: str, qm, work: Path, new_tokens: int, rounds: int) -> dict:
    """The runs on one board, repeated ``rounds`` times in turn (so a busy host slows all alike):
    whole head vs greedy (the tile scan), prefill with and without the head, f32 vs int8 KV cache (LAYOUT)."""
    tok = qm.tokenizer
    long_ids = list(encode(tok, PROMPT, bos=True))
    pre_ids = list(encode(tok, PREFILL_PROMPT, bos=True))
    blob, fw = blob_and_firmware(qm, board, work)
    ctx = (start_native_board(fw.binary, blob) if board == "native"
           else start_emulated_board(fw.binary, blob, board=board, timeout=60))
    n_out = qm.config.n_out
    with ctx as vb, session(vb.port, 120, 60) as s:
        hello = s.hello
        runs: dict = {k: [] for k in ("full", "pruned", "pre_full", "pre_skip", "int8")}
        for _ in range(rounds):
            s.set_layout(*kv_layout(blob, "f32"))
            runs["full"].append(s.generate(Generate(long_ids, new_tokens, all_logits=True)))
            runs["pruned"].append(s.generate(Generate(long_ids, new_tokens)))
            runs["pre_full"].append(s.generate(Generate(pre_ids, 1, all_logits=True)))
            runs["pre_skip"].append(s.generate(Generate(pre_ids, 1)))
            s.set_layout(*kv_layout(blob, "int8"))
            runs["int8"].append(s.generate(Generate(long_ids, new_tokens)))
    for f, p in zip(runs["full"], runs["pruned"]):
        assert [t.out_id for t in f.generated_steps] == [t.out_id for t in p.generated_steps], \
            "the greedy scan chose other tokens than the whole head"
    dec_f, dec_p, dec_8 = ([t for r in runs[k] for t in r.generated_steps] for k in ("full", "pruned", "int8"))

    def steady(key, f) -> float:
        return _median(fastest(runs[key], f))
    c = qm.config
    ids_f32 = [t.out_id for t in runs["pruned"][0].generated_steps]
    ids_i8 = [t.out_id for t in runs["int8"][0].generated_steps]
    diverge = next((i for i, (a, b) in enumerate(zip(ids_f32, ids_i8)) if a != b), None)

    def prefill(key):
        per = [(sum(sum(t.us) for t in r.prompt_steps), sum(t.us[OUT] for t in r.prompt_steps)) for r in runs[key]]
        return dict(steps=len(runs[key][0].prompt_steps), total_us=min(a for a, _ in per),
                    output_us=min(b for _, b in per))

    return dict(
        board=hello.board, clock=hello.clock_name, prompt_tokens=len(long_ids), rounds=rounds,
        decode_steps=len(runs["pruned"][0].generated_steps),
        # the head and the argmax: a whole head's argmax is the sampling phase, the greedy scan's is its own
        output_us_full=steady("full", lambda t: t.us[OUT] + t.us[SAMPLE]),
        output_us_pruned=steady("pruned", lambda t: t.us[OUT] + t.us[SAMPLE]),
        token_us_full=steady("full", lambda t: sum(t.us)), token_us_pruned=steady("pruned", lambda t: sum(t.us)),
        head_rows_pct=100.0 * statistics.mean(t.head_rows for t in dec_p) / n_out,
        head_rows_min_pct=100.0 * min(t.head_rows for t in dec_p) / n_out,
        flash_bytes_full=_median([t.bytes_read[0] for t in dec_f]),
        flash_bytes_pruned=_median([t.bytes_read[0] for t in dec_p]),
        prefill_prompt_tokens=len(pre_ids), prefill_with_head=prefill("pre_full"),
        prefill_without_head=prefill("pre_skip"),
        attention_us_f32=steady("pruned", lambda t: t.us[ATTN]), attention_us_int8=steady("int8", lambda t: t.us[ATTN]),
        kv_read_per_token_f32=_median([t.bytes_read[2] for t in dec_p]),
        kv_read_per_token_int8=_median([t.bytes_read[2] for t in dec_8]),
        kv_stored_per_position_f32=kv_position_bytes(c, "f32"),
        kv_stored_per_position_int8=kv_position_bytes(c, "int8"),
        int8_first_divergence=diverge,
    )


def eval_ids() -> np.ndarray:
    """The token stream of models/default/eval.txt (converter.evaluate's, as ``flashlm eval`` reads it)."""
    return evaluate.load(evaluate.locate(MODEL))[2]


def eval_loss(qm, ids: np.ndarray, windows: int, kv: str) -> dict:
    """Mean next-token cross-entropy (nats) of the reference with a ``kv`` cache over the first
    ``windows`` consecutive max_seq_len windows (converter.evaluate's windows and score)."""
    n = min(windows * qm.config.max_seq_len, len(ids) - 1)
    loss = evaluate.score(evaluate.reference_logits(qm, ids, n, kv), ids[1:n + 1]) / n
    return dict(loss=loss, ppl=math.exp(loss), tokens=n)


def measure(work: Path, runs, echo: bool = True) -> dict:
    """``board_figures`` for each (name, quantized model, board, decode tokens, rounds), printed as
    each is measured when ``echo``."""
    out = {}
    for name, qm, board, n, rounds in runs:
        (work / name).mkdir()
        t0 = time.monotonic()
        out[name] = board_figures(board, qm, work / name, n, rounds)
        out[name]["wall_s"] = time.monotonic() - t0
        if echo:
            print_board(name, out[name])
    return out


def short(work: Path, qm, echo: bool = True) -> dict:
    """The short mode (``make bench``): ``qm`` on the native board (48 decode tokens, 3 rounds) and
    on the emulated RP2040 (4 decode tokens); no int4 head, no eval."""
    return measure(work, [("native_q8", qm, "native", 48, 3), ("rp2040_emu_q8", qm, "rp2040-emu", 4, 1)], echo)


def section(work: Path) -> dict:
    """The short mode as a ``python -m bench`` section, with its ratios."""
    out = short(work, default_quant("q8"), echo=False)
    ratios = {}
    for board, f in out.items():
        pf, ps = f["prefill_with_head"], f["prefill_without_head"]
        ratios.update({f"{board}: greedy scan/whole head output µs": f["output_us_pruned"] / f["output_us_full"],
                       f"{board}: prefill without/with head µs": ps["total_us"] / pf["total_us"],
                       f"{board}: int8/f32 KV attention µs": f["attention_us_int8"] / f["attention_us_f32"]})
    return {"speed": out, "ratios": ratios}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96, help="decode tokens on the native board (default 96)")
    ap.add_argument("--rounds", type=int, default=5, help="repetitions of each native run, interleaved (default 5)")
    ap.add_argument("--emu-tokens", type=int, default=10, help="decode tokens on the emulated RP2040 (default 10)")
    ap.add_argument("--eval-windows", type=int, default=16, help="128-token windows of eval.txt (default 16; 0: none)")
    ap.add_argument("--no-emu", action="store_true", help="skip the emulated RP2040")
    ap.add_argument("--short", action="store_true", help="what make bench runs: q8 only, native 48 decode tokens x 3 "
                    "rounds, emulated 4 decode tokens, no eval (a few minutes)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    q8 = default_quant("q8")
    q4head = converted(default_ir(), "q8", ["head=q4"])
    out: dict = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "model": str(MODEL.relative_to(ROOT))}
    runs = [("native_q8", q8, "native", a.tokens, a.rounds), ("native_q8_head_q4", q4head, "native", a.tokens, a.rounds),
            ("rp2040_emu_q8", q8, "rp2040-emu", a.emu_tokens, 1),
            ("rp2040_emu_q8_head_q4", q4head, "rp2040-emu", a.emu_tokens, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        out.update(short(Path(tmp), q8) if a.short else
                   measure(Path(tmp), [r for r in runs if r[2] == "native" or not a.no_emu]))
    if a.eval_windows > 0 and not a.short:
        ids = eval_ids()
        t0 = time.monotonic()
        out["eval"] = {"windows": a.eval_windows, "of_tokens": len(ids) - 1,
                       "q8_f32kv": eval_loss(q8, ids, a.eval_windows, "f32"),
                       "q8_int8kv": eval_loss(q8, ids, a.eval_windows, "int8"),
                       "q8_head_q4_f32kv": eval_loss(q4head, ids, a.eval_windows, "f32")}
        e = out["eval"]
        print(f"\nquality (NumPy reference, first {e['windows']} windows of 128 tokens = {e['q8_f32kv']['tokens']:,} of "
              f"{e['of_tokens']:,} eval tokens of {out['model']}/eval.txt; {time.monotonic() - t0:.0f} s host time):")
        base = e["q8_f32kv"]
        for k, label in (("q8_f32kv", "q8 weights, f32 KV cache"), ("q8_int8kv", "q8 weights, int8 KV cache"),
                         ("q8_head_q4_f32kv", "q8 weights, q4 head, f32 KV")):
            r = e[k]
            print(f"  {label:30s} loss {r['loss']:.4f} nats/token, ppl {r['ppl']:.3f}  "
                  f"(delta {r['loss'] - base['loss']:+.4f} nats)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


def print_board(name: str, f: dict) -> None:
    pf, ps = f["prefill_with_head"], f["prefill_without_head"]
    print(f"\n{name}: board {f['board']}, {f['clock']}; {f['prompt_tokens']}-token prompt, {f['decode_steps']} decode "
          f"steps, {f['rounds']} round(s) (per step the fastest round, then the median over steps; prefill: the "
          f"fastest round)")
    print(f"  output + sampling per decode token: whole head {f['output_us_full']:,.0f} µs, greedy scan {f['output_us_pruned']:,.0f} "
          f"µs (x{f['output_us_pruned'] / max(f['output_us_full'], 1):.3f}); token {f['token_us_full']:,.0f} -> "
          f"{f['token_us_pruned']:,.0f} µs")
    print(f"  head rows the greedy scan visits: {f['head_rows_pct']:.1f} % of out_vocab on average "
          f"(fewest {f['head_rows_min_pct']:.1f} %); flash bytes per token {f['flash_bytes_full']:,.0f} -> "
          f"{f['flash_bytes_pruned']:,.0f}")
    print(f"  prefill of a {f['prefill_prompt_tokens']}-token prompt ({pf['steps']} prefill steps): with the head "
          f"{pf['total_us']:,.0f} µs (output {pf['output_us']:,.0f}), without {ps['total_us']:,.0f} µs (output "
          f"{ps['output_us']:,.0f}): x{ps['total_us'] / max(pf['total_us'], 1):.3f}")
    print(f"  KV cache f32 -> int8: attention {f['attention_us_f32']:,.0f} -> {f['attention_us_int8']:,.0f} µs per "
          f"decode token; KV bytes read per decode token {f['kv_read_per_token_f32']:,.0f} -> "
          f"{f['kv_read_per_token_int8']:,.0f}; stored per position {f['kv_stored_per_position_f32']:,} -> "
          f"{f['kv_stored_per_position_int8']:,}; greedy tokens "
          + ("all the same" if f["int8_first_divergence"] is None else f"differ from decode step {f['int8_first_divergence']}"))


if __name__ == "__main__":
    raise SystemExit(main())
