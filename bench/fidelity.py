"""make bench's fidelity section: every recipe of converter/fidelity_recipes.py against fp32 with the
device's numerics (the NumPy reference, bit-exact with every board) on stories260K (the real llama2.c model
shared beside the project, ../shared/models/stories260K, or one folder further up from a git worktree;
left out where absent) and, convert's defaults and a few variants only (its reference takes several times longer a token), on the
shipped default model: teacher-forced top-1 agreement, mean KL and ΔCE over 2,000 positions of fp32's own
sampled text, greedy agreement over 16 prompts x 200 tokens (or to the context's end)."""
from __future__ import annotations

from pathlib import Path

from converter.fidelity_recipes import RECIPES, measure
from converter.load import load_model

from .model import MODEL, ROOT

STORIES = "stories260K"
DEFAULT_RECIPES = tuple(r for r in RECIPES if r.label in ("q8 default", "q8, int8 KV", "q8, nearest rounding", "q4 default",
                                                       "q4, nearest rounding", "q4, GPTQ"))


def shared_stories() -> Path | None:
    found = [up / "shared" / "models" / STORIES for up in (ROOT.parent, ROOT.parent.parent)]
    return next((d for d in found if (d / "stories260K.bin").is_file()), None)


def models() -> dict:
    """name -> (loader, recipes)."""
    out = {"default": (lambda: load_model(MODEL / "model.pt"), DEFAULT_RECIPES)}
    d = shared_stories()
    if d is not None:
        out[STORIES] = (lambda: load_model(d / "stories260K.bin", tokenizer_path=d / "tok512.bin"), RECIPES)
    return out


def section(work: Path) -> dict:
    out = {name: measure(load(), recipes) for name, (load, recipes) in models().items()}
    ratios = {}
    for name, r in out.items():
        rows = {row["label"]: row for row in r["rows"]}
        for label in ("q8 default", "q4 default"):
            row = rows[label]
            ratios[f"fidelity {name} {label}: top-1 agreement with fp32 (reference, device numerics)"] = \
                row["top1_agreement"]
            g = row["greedy"]
            ratios[f"fidelity {name} {label}: greedy tokens equal to fp32's / {g['tokens']}, median of "
                   f"{g['prompts']} prompts"] = g["median"] / g["tokens"]
        for fmt, gptq, nearest in (("q8", "q8 default", "q8, nearest rounding"),
                                   ("q4", "q4, GPTQ", "q4, nearest rounding")):
            ratios[f"fidelity {name} {fmt}: mean KL(fp32 || q), GPTQ / nearest rounding"] = \
                rows[gptq]["kl_mean"] / rows[nearest]["kl_mean"]
        ratios[f"fidelity {name} q4: mean KL(fp32 || q), the default (QAT) / nearest rounding"] = \
            rows["q4 default"]["kl_mean"] / rows["q4, nearest rounding"]["kl_mean"]
    return {"fidelity": out, "ratios": ratios}


def print_table(results: dict) -> None:
    """The section's figures as text (make bench prints them before the ratios)."""
    for name, r in results.items():
        print(f"fidelity, {name}: each recipe against fp32, NumPy reference (device numerics); teacher-forced over "
              f"{r['positions']:,} positions of fp32's sampled text, greedy over {r['prompts']} prompts x "
              f"{r['tokens']} tokens")
        print(f"  {'recipe':<56}{'bits/w':>7}{'top-1':>8}{'KL':>10}{'ΔCE':>9}{'greedy median':>15}")
        for row in r["rows"]:
            print(f"  {row['label'] + ' (' + row['recipe'] + ')':<56}{row['bits_per_weight']:>7.2f}"
                  f"{row['top1_agreement'] * 100:>7.1f}%{row['kl_mean']:>10.5f}{row['delta_ce']:>+9.4f}"
                  f"{row['greedy']['median']:>15.0f}")
