"""``python -m bench.ple_seed``: the planner's *predicted* cost per token of the 28.9M-parameter
Per-Layer-Embedding shape (converter/shapes.py ``ple-28m``: int4, groups of 128, fp16 scales) on
the ESP32-S3 N16R8 profile, phase by phase, beside the *published measurement* of that model on
that chip (the baseline build's per-phase breakdown, converter/shapes.py), and the token beside the
best published build's. Nothing here runs on a board: the left column is a prediction from
boards/esp32s3-n16r8.toml (its compute calibration refit from the ESP32-S3 instruction set's counts
in QEMU, bench/esp_qemu.py), the right one somebody's measurement.

Also prints where the planner puts the big tensors and the bytes a token reads per tier.
"""
from __future__ import annotations

import argparse
import json

from converter.costmodel import PHASES
from converter.planner import plan
from converter.shapes import SHAPES, shape_spec

LABEL = {"embed": "input (embed)", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "head (output)",
         "sampling": "sampling"}


def seed_table(shape: str = "ple-28m", pos: int | None = None) -> dict:
    """Predicted ms per phase (planner, board profile) and the published ms, with their ratio."""
    s = SHAPES[shape]
    pub = s["published"]
    pl = plan(shape_spec(shape), pub["board"], pos=pos, head="full")   # the published head scanned every row
    pred = {ph: pl.prediction.phase_us[ph] / 1000 for ph in PHASES}
    rows = [dict(phase=ph, predicted_ms=pred[ph], published_ms=pub["phase_ms"].get(ph),
                 ratio=(pred[ph] / pub["phase_ms"][ph]) if ph in pub["phase_ms"] else None) for ph in PHASES]
    total = sum(pred.values())
    return dict(shape=shape, board=pub["board"], position=pl.pos, rows=rows, predicted_total_ms=total,
                published_total_ms=pub["total_ms"], ratio_total=total / pub["total_ms"],
                published_best_ms=pub["best_ms"], ratio_best=total / pub["best_ms"],
                tiers={n: pl.tiers[n] for n in ("tok_embeddings", "ple.table")},
                bytes_per_token=dict(pl.prediction.bytes_read), blob_bytes=pl.spec.blob_bytes,
                flash_budget=pl.budget["flash"])


def print_table(t: dict) -> None:
    print(f"{t['shape']} on {t['board']}: planner PREDICTION at position {t['position']} (board profile) "
          f"vs PUBLISHED MEASUREMENT")
    print(f"{'phase':<16}{'predicted ms':>14}{'published ms':>14}{'pred/pub':>10}")
    for r in t["rows"]:
        pub = f"{r['published_ms']:.1f}" if r["published_ms"] is not None else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        print(f"{LABEL[r['phase']]:<16}{r['predicted_ms']:>14.1f}{pub:>14}{ratio:>10}")
    print(f"{'token':<16}{t['predicted_total_ms']:>14.1f}{t['published_total_ms']:>14.1f}{t['ratio_total']:>10.2f}")
    print(f"{'token, best':<16}{t['predicted_total_ms']:>14.1f}{t['published_best_ms']:>14.1f}{t['ratio_best']:>10.2f}"
          f"   (the best published build; no phase breakdown)")
    print(f"placement: tok_embeddings in {t['tiers']['tok_embeddings']}, ple.table in {t['tiers']['ple.table']}; "
          f"predicted bytes per token: " + ", ".join(f"{k} {v:,}" for k, v in t["bytes_per_token"].items()))
    print(f"blob {t['blob_bytes']:,} bytes of a {t['flash_budget']:,}-byte flash budget")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ple_seed", description=__doc__.splitlines()[0])
    ap.add_argument("--pos", type=int, help="position to predict at (default: mid-context)")
    ap.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    args = ap.parse_args(argv)
    t = seed_table(pos=args.pos)
    print_table(t)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(t, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
