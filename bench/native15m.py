"""The native engine beside llama2.c's ``runq.c``, measured in one run:

* instructions per decode token of the native engine under callgrind (bench/callgrind.py:
  deterministic, the difference of two runs) on the 15M-parameter llama2.c shape
  (bench.model.SHAPE_15M, seeded random weights) written by our own llama2.c v2 writer (Q8_0,
  groups of 32) and imported as it is (its codes and scales kept, not re-quantized): with the
  greedy head (the "pruned" figures: the tile scan where convert keeps a head index; on these
  random weights it leaves it out, so the whole head and its argmax) and with ``--all-logits``
  (every step's whole head, the argmax in sampling), as ``flashlm build``
  makes it (the loader picks the AVX2 clone of the row kernels on a CPU with AVX2) and as the
  x86-64 baseline alone (FLM_NO_CLONES); beside runq.c's 57.7M per token (built -O3,
  single-threaded, callgrind on the same shape): MEASURED ONCE, WHEN THE NATIVE KERNELS WERE FIRST
  COMPARED WITH runq.c, NOT IN THIS RUN (llama2.c is neither built here nor committed);
* native tok/s on the host clock for every shipped model (models/default, ple, ple-dense at q8,
  group 32, the head index convert keeps: what ``flashlm convert`` makes) and the 15M shape,
  greedy head vs ``--all-logits``, the two generating the same prompt in alternating rounds (per
  decode step the fastest round counts, bench/speed.py ``fastest``), and the head rows the greedy
  steps visited.
"""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from converter.load import load_model
from host.boards.native import start_native_board
from host.link.messages import Generate

from . import callgrind
from .model import ROOT, blob_and_firmware, converted, llama15m_v2, prompt_ids, session
from .speed import fastest

RUNQ_IR_PER_TOKEN = 57.7e6     # runq.c -O3 under callgrind, measured once: a 201-step minus a 1-step run, over 200
IR_TARGET = 40e6               # the target set for the native engine on this shape when its kernels were tuned
SHIPPED = ("default", "ple", "ple-dense")
IDS_15M = [1, 450, 4799, 3874, 29879, 263, 931, 29892]   # the 15M shape has no tokenizer: fixed ids
DECODE = 16                    # callgrind: decode tokens between the two runs
ROUNDS, NEW_TOKENS = 3, 64     # host clock


def model_15m(work: Path):
    """The 15M checkpoint through our v2 writer, loaded and 'quantized' as flashlm convert would:
    every matrix must arrive as the file's Q8_0 tensor itself (and the head index calibrated: on these
    random weights convert leaves it out, so greedy steps compute the whole head)."""
    ir = load_model(llama15m_v2(work))
    qm = converted(ir, "q8")
    kept = [n for n, t in qm.tensors.items() if hasattr(t, "codes")]
    assert all(qm.tensors[n] is ir.tensors[n] for n in kept), "the Q8_0 checkpoint was re-quantized"
    return qm, len(kept)


def baseline_build(fw, work: Path) -> Path:
    """The same project built without the AVX2 clones (flm_config.h is included by every source)."""
    proj = work / "fw-baseline"
    subprocess.run(["cp", "-r", str(fw.project_dir), str(proj)], check=True)
    cfg = proj / "flm_config.h"
    cfg.write_text(cfg.read_text() + "#define FLM_NO_CLONES 1\n")
    subprocess.run(["make", "-s", "-B", "-C", str(proj)], check=True, capture_output=True)
    return proj / "firmware"


def instructions(binary: Path, blob: Path, ids: list[int], work: Path, all_logits: bool) -> dict:
    first = callgrind.profile(binary, blob, ids, 1, work / "first.out", all_logits)
    longer = callgrind.profile(binary, blob, ids, 1 + DECODE, work / "longer.out", all_logits)
    return callgrind.decode_figures(first, longer, DECODE, len(ids))


def tok_per_s(blob: Path, binary: Path, ids: list[int]) -> dict:
    """Pruned head vs --all-logits on one board, in alternating rounds; the same tokens both ways."""
    runs: dict = {"pruned": [], "all_logits": []}
    with start_native_board(binary, blob) as b, session(b.port, 120) as s:
        for _ in range(ROUNDS):
            for k in runs:
                runs[k].append(s.generate(Generate(ids, NEW_TOKENS, all_logits=k == "all_logits")))
    a, p = ([t.out_id for t in runs[k][0].generated_steps] for k in ("all_logits", "pruned"))
    assert a == p, "the pruned head chose other tokens than the whole head"
    out = {}
    for k, r in runs.items():
        per_step = fastest(r, lambda t: sum(t.us), 1)
        out[f"tok_per_s_{k}"] = len(per_step) / (sum(per_step) / 1e6)
    dec = runs["pruned"][0].generated_steps[1:]
    out.update(clock=runs["pruned"][0].clock, decode_steps=len(dec),
               head_rows_out_vocab=runs["all_logits"][0].generated_steps[-1].head_rows,
               head_rows_pruned_mean=statistics.mean(t.head_rows for t in dec))
    return out


def section(work: Path) -> dict:
    why = callgrind.callgrind_missing()
    if why:
        raise RuntimeError(why)
    qm, kept = model_15m(work / "m15")
    blob, fw = blob_and_firmware(qm, "native", work / "m15")
    base = baseline_build(fw, work / "m15")
    ir = {}
    for build, binary in (("clones", fw.binary), ("baseline", base)):
        for head in ("pruned", "all_logits"):
            d = work / "m15" / f"cg-{build}-{head}"
            d.mkdir()
            ir[f"{build}_{head}"] = instructions(binary, blob, IDS_15M, d, head == "all_logits")
    speed = {"15M": tok_per_s(blob, fw.binary, IDS_15M)}
    for name in SHIPPED:
        m = converted(load_model(ROOT / "models" / name / "model.pt"), "q8")
        b, f = blob_and_firmware(m, "native", work / name)
        speed[name] = tok_per_s(b, f.binary, prompt_ids(m))
    per = {k: v["ir_per_decode_token"] for k, v in ir.items()}
    out = {"native15m": dict(
        shape="llama2.c 15M: dim 288, 6 layers, 6 heads, hidden 768, vocab 32000; random weights",
        checkpoint="llama2.c v2 (Q8_0, group 32) by converter.llama2c.write_llama2c_v2", matrices_kept=kept,
        compiler=subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        cpu_avx2="avx2" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else None,
        runq_ir_per_token_issue=RUNQ_IR_PER_TOKEN, ir_target=IR_TARGET,
        callgrind=ir, tok_s=speed)}
    out["ratios"] = {
        "15M native Ir/token / runq.c -O3 (57.7M, measured once), pruned head": per["clones_pruned"] / RUNQ_IR_PER_TOKEN,
        "15M native Ir/token / runq.c -O3 (57.7M, measured once), --all-logits": per["clones_all_logits"] / RUNQ_IR_PER_TOKEN,
        "15M native Ir/token, x86-64 baseline / AVX2 clone, --all-logits":
            per["baseline_all_logits"] / per["clones_all_logits"],
        **{f"native tok/s pruned / --all-logits, {k}": v["tok_per_s_pruned"] / v["tok_per_s_all_logits"]
           for k, v in speed.items()}}
    return out


def print_table(r: dict) -> None:
    c = r["callgrind"]
    print(f"\n{r['shape']}; {r['checkpoint']}, {r['matrices_kept']} matrices imported as they are")
    print(f"callgrind instructions per decode token, native engine ({r['compiler']}; CPU AVX2: {r['cpu_avx2']}):")
    print(f"{'build':<36}{'pruned head':>14}{'--all-logits':>14}{'head rows':>11}")
    for build, label in (("clones", "flashlm build (loader's pick)"), ("baseline", "x86-64 baseline (FLM_NO_CLONES)")):
        p, a = c[f"{build}_pruned"], c[f"{build}_all_logits"]
        print(f"{label:<36}{p['ir_per_decode_token'] / 1e6:>13.2f}M{a['ir_per_decode_token'] / 1e6:>13.2f}M"
              f"{p['head_rows_per_decode_token']:>11.0f}")
    print(f"{'runq.c -O3 (ONE-OFF, NOT MEASURED HERE)':<36}{'':>14}{r['runq_ir_per_token_issue'] / 1e6:>13.1f}M")
    print(f"target: <= {r['ir_target'] / 1e6:.0f}M")
    print("native tok/s (host clock), pruned head vs --all-logits:")
    for name, v in r["tok_s"].items():
        print(f"  {name:<12}{v['tok_per_s_pruned']:>10.1f}{v['tok_per_s_all_logits']:>10.1f}   pruned/all "
              f"{v['tok_per_s_pruned'] / v['tok_per_s_all_logits']:.3f}, head rows {v['head_rows_pruned_mean']:.0f} of "
              f"{v['head_rows_out_vocab']}")
