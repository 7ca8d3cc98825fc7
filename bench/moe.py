"""``make bench``, section moe: the shipped mixture of experts (models/moe: the default model's shape,
its FFN 4 experts of half the width, 2 read per token) beside the dense default model (the same bytes
read per token) and models/moe-dense (the same parameters, one FFN as wide as the four experts).

* eval loss, perplexity and bits/char of the three and of models/moe-same-bytes (the default preset
  trained the steps moe was: the same bytes per token and the same training) over the whole
  held-out ``eval.txt`` in fp32
  (PyTorch; ``converter.train.evaluate_dir``);
* on the emulated RP2040 (rp2040js at 125 MHz, the harness's XIP model on, every tensor in flash,
  q8 group 32 as ``flashlm convert`` makes it, the experts' use calibrated on eval.txt): cycles per
  decode token, and the flash bytes per decode token the core loaded from the FFN's matrices (the
  harness's count of the reads in their blob ranges: every expert's for moe, w1/w2/w3 for default)
  beside the bytes of reading every row of them once; for moe, that share against k/E;
* the planner's PREDICTED decode token of each (q8) on the ESP32-S3 N16R8 and the Pico profiles.
"""
from __future__ import annotations

import math
from pathlib import Path

from converter import expertuse
from converter.corpus import split_docs
from converter.costmodel import ModelSpec
from converter.load import load_model

from .emulated import emu_run
from .model import ROOT, converted, default_quant
from .predict import BOARDS, predicted

# moe-same-bytes: the default preset trained the steps moe was (the same bytes per token, the same training)
MODELS = {name: ROOT / "models" / name for name in ("default", "moe-same-bytes", "moe", "moe-dense")}
BOUND = 1.1         # the bound: FFN flash bytes per token <= 1.1 x k/E of reading every expert


def fp32_eval(d: Path) -> dict:
    import torch

    from converter.train import evaluate_dir
    torch.set_num_threads(2)
    loss, n, ck = evaluate_dir(d)
    chars = sum(map(len, split_docs((d / "eval.txt").read_text(encoding="utf-8"))))
    c = load_model(d / "model.pt").config
    return dict(params=c.n_params(), **c.param_split(), eval_loss=loss, eval_ppl=math.exp(loss), eval_tokens=n,
                eval_bits_per_char=loss * n / (chars * math.log(2)), train_steps=ck["train"]["steps"])


def moe_quant():
    """models/moe as ``flashlm convert`` makes it: q8 group 32, the experts' use calibrated on its eval.txt."""
    qm = converted(load_model(MODELS["moe"] / "model.pt"), "q8")
    qm.expert_use = expertuse.calibrate(qm, MODELS["moe"] / "eval.txt")
    return qm


def ffn_names(c) -> tuple[str, ...]:
    return tuple(f"{pre}{w}" for layer in range(c.n_layers) for pre in c.ffn_prefixes(layer) for w in ("w1", "w2", "w3"))


def section(work: Path) -> dict:
    evals = {name: fp32_eval(d) for name, d in MODELS.items()}
    quants = {"default": default_quant("q8"), "moe": moe_quant()}
    emu = {}
    for name, qm in quants.items():
        r = emu_run(qm, work / name, watch=ffn_names(qm.config))
        emu[name] = dict(cycles_per_token=r["cycles_per_token"], device_us_per_token=r["device_us_per_token"],
                         flash_bytes_per_token=r["bytes_per_token"]["flash"],
                         ffn_flash_bytes_per_token=r["watched_bytes_per_token"],
                         ffn_flash_bytes_every_row=r["watched_bytes_every_row"],
                         ffn_share_read=r["watched_bytes_per_token"] / r["watched_bytes_every_row"],
                         decode_steps=r["decode_steps"], golden_bit_exact=r["golden_bit_exact"])
    c = quants["moe"].config
    k_over_e = c.moe_top_k / c.n_experts
    use = quants["moe"].expert_use
    pred = {b: {name: predicted(ModelSpec.from_quant(qm, f"models/{name} q8"), b) for name, qm in quants.items()}
            for b in BOARDS}
    m, d = emu["moe"], emu["default"]
    out = {"board": "rp2040-emu", "xip_model": "on", "recipe": "q8 g32, every tensor in flash",
           "n_experts": c.n_experts, "top_k": c.moe_top_k, "k_over_e": k_over_e, "bound": BOUND * k_over_e,
           "within_bound": int(m["ffn_share_read"] <= BOUND * k_over_e),
           "expert_use": {"source": use.source.replace(f"{ROOT}/", ""), "share": use.shares()},
           "eval_fp32": evals, "emulated": emu, "predicted": pred,
           "moe_beats_equal_bytes": int(evals["moe"]["eval_loss"] < evals["moe-same-bytes"]["eval_loss"])}
    ratios = {
        "moe: FFN flash bytes per decode token / every expert's, over k/E (rp2040-emu, XIP model)":
            m["ffn_share_read"] / k_over_e,
        "moe/default FFN flash bytes per decode token (rp2040-emu, XIP model)":
            m["ffn_flash_bytes_per_token"] / d["ffn_flash_bytes_per_token"],
        "moe/default cycles per decode token (rp2040-emu, XIP model)": m["cycles_per_token"] / d["cycles_per_token"],
        "moe/moe-same-bytes eval perplexity (fp32, same bytes per token, same steps)":
            evals["moe"]["eval_ppl"] / evals["moe-same-bytes"]["eval_ppl"],
        "moe/moe-dense eval perplexity (fp32, same parameters)": evals["moe"]["eval_ppl"] / evals["moe-dense"]["eval_ppl"],
        **{f"moe/default predicted ms per token, {b}": pred[b]["moe"]["total_ms"] / pred[b]["default"]["total_ms"]
           for b in BOARDS if pred[b]["moe"]["fits"] and pred[b]["default"]["fits"]},
    }
    return {"moe": out, "ratios": ratios}


def print_table(r: dict) -> None:
    """The section's figures as text (make bench prints them before the ratios)."""
    print(f"mixture of experts: models/moe ({r['n_experts']} experts, top {r['top_k']}) beside models/default "
          "and models/moe-same-bytes "
          "(same bytes per token) and models/moe-dense (same parameters)")
    print(f"  {'model':<10}{'params':>11}{'eval loss':>11}{'ppl':>8}{'bits/char':>11}   (fp32, all of eval.txt)")
    for name, e in r["eval_fp32"].items():
        print(f"  {name:<10}{e['params']:>11,}{e['eval_loss']:>11.4f}{e['eval_ppl']:>8.2f}{e['eval_bits_per_char']:>11.4f}")
    print(f"  emulated RP2040, XIP model on, {r['recipe']}: per decode token")
    for name, e in r["emulated"].items():
        print(f"  {name:<10}{e['cycles_per_token']:>13,.0f} cycles  FFN flash {e['ffn_flash_bytes_per_token']:>9,.0f} B "
              f"of {e['ffn_flash_bytes_every_row']:,} B every row ({100 * e['ffn_share_read']:.1f} %)")
    print(f"  moe reads {100 * r['emulated']['moe']['ffn_share_read']:.1f} % of its experts' bytes a token; "
          f"k/E = {100 * r['k_over_e']:.1f} %, bound 1.1 x k/E = {100 * r['bound']:.1f} %")
    for b, models in r["predicted"].items():
        print(f"  PREDICTED on {b} (planner): " + "; ".join(
            f"{name} {p['total_ms']:.1f} ms/token, {p['tok_per_s']:.2f} tok/s" if p["fits"] else f"{name}: does not fit"
            for name, p in models.items()))
