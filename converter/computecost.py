"""The arithmetic one token costs per phase on a board (converter/costmodel.py counts its bytes): the
multiply-accumulates and float operations of firmware/engine/engine.c operation by operation, at the
board profile's cycles per MAC and per float operation ([compute]), split into what runs inside the
matrix products (which a board may split across its cores) and the element-wise work hal_parallel may
split too; converter/timing.py turns them into predicted microseconds."""
from __future__ import annotations

from dataclasses import replace

from .costmodel import PHASES, ModelSpec, TensorSpec, expert_reads, head_mode, head_rows, tiles_visited
from .overlap import split_cores, stream_cycles

# Float operations per call of the engine's own functions (flm_math.c), in units of an add or a
# multiply: expf is one multiply, then integers (a rounding on the bits, a table entry interpolated,
# the exponent packed) [EST 2]; a division [EMU 3: bench.kernels' soft-float fdiv 177 cycles against
# fadd/fmul 60-71 on the emulated RP2040]; sqrt a few Newton steps [EST]; silu = x / (1 + exp(-x)),
# gelu = x / (1 + exp(-2u)) with u = x (K0 + K1 x^2).
FLOPS_EXP = 2
FLOPS_SQRT = 20
FLOPS_DIV = 3
FLOPS_GELU = 6 + FLOPS_EXP + FLOPS_DIV
Q4_MAC_FACTOR = 1.5      # [EST] a q4 multiply-accumulate against a q8 one: nibble unpacking (portable C)
# Compute defaults for a profile without [compute], by chip: (cycles per MAC, per float operation,
# q4 MAC factor). RP2040: our calibration on the rp2040-emu board (boards/pico.toml [EMU]): the q4
# factor is bench.kernels' row-scaled q4/q8 cycles per weight (4.18 / 5.88 at g32: two q4 codes a
# MULS), the other two a least-squares fit to the emulated per-phase cycles of models/default q8
# and q4 (row scales, int8 KV, the head index; XIP model off: what compute alone costs)
CHIP_COMPUTE = {"RP2040": (5.3, 61.0, 0.71)}
Q4_LANE_WORDS = 544      # the most lane words a q4 row-scaled product's rows take (rs_lanes_rp2040.h FLM_RS_LANE_WORDS)


def compute_cycles(spec: ModelSpec, pos: int, prof: dict, kv: str = "f32",
                   sampling: str = "greedy", head: str | int | None = None, experts=None) -> dict[str, float]:
    """Cycles per phase on ``prof``'s CPU: MACs x cycles_per_mac + flops x cycles_per_flop (a mixture
    of experts' chosen experts as usage counts them)."""
    return compute_parts(spec, pos, prof, kv, sampling, head, experts)[0]


def compute_parts(spec: ModelSpec, pos: int, prof: dict, kv: str = "f32", sampling: str = "greedy",
                  head: str | int | None = None, experts=None, pass_n: int = 1,
                  rows_after: frozenset = frozenset()) -> tuple[dict, dict, dict]:
    """compute_cycles' cycles per phase, and of them per phase the matrix products' rows (their
    multiply-accumulates and per-row scaling: what runs inside hal_matmul, which a board may split
    across its cores), and the work a board may split across its cores too (hal.h hal_parallel: the
    activations' codes, the norms' scaling, RoPE, attention's heads, the residuals, the FFN's SiLU x up;
    the norms' sums (their squares split), the scales' divisions and the KV rows' quantization stay on one
    core, except in a pass of several tokens, whose tokens' sums and KV rows the cores share: engine.c
    rmsnorm, kv_put_all).
    ``pass_n``: the tokens of the forward pass this token is one of (a board's multi-token rows).
    ``rows_after``: the phases whose products take the work on their output rows (hal.h
    hal_matmul_each: a board that streams them; the residuals after wo and w2, the FFN's SiLU and its
    product with w3's rows), which then counts with the products' rows instead of hal_parallel's."""
    cfg = spec.config
    comp = prof.get("compute", {})
    fpu = bool(prof.get("fpu", True))
    d_mac, d_flop, d_q4 = CHIP_COMPUTE.get(prof.get("chip"), (4.0, 2.0 if fpu else 50.0, Q4_MAC_FACTOR))
    cpm = float(comp.get("cycles_per_mac", d_mac))
    cpf = float(comp.get("cycles_per_flop", d_flop))
    q4f = float(comp.get("q4_mac_factor", d_q4))
    dq_flops = float(comp.get("dequant_flops", 2.0))
    quad = float(comp.get("q8_quad_mac_factor", 1.0))
    quad4 = float(comp.get("q4_quad_mac_factor", 1.0))
    q4_g16 = float(comp.get("q4_g16_cycles", 0.0))
    stage = int(comp.get("pass_stage_words", 0))
    by = spec.by_name()
    d, hd, hid = cfg.dim, cfg.head_dim, cfg.hidden_dim
    rows_part = dict.fromkeys(PHASES, 0.0)
    par_part = dict.fromkeys(PHASES, 0.0)

    def quad_factor(w: TensorSpec) -> float:
        """A row-scaled product's multiply-accumulates in a pass of four tokens or more on a board
        with four-token rows (kernels_arch.h flm_rs_staged_rows), the quads' tokens at
        ``q8_quad_mac_factor`` / ``q4_quad_mac_factor`` of a single token's cost: q8, groups of 16
        or 32 codes, as many quads as its stage of ``pass_stage_words`` holds at 2 words a column;
        q4, groups of 16 or of a multiple of 32 codes and at most 1,024 columns, every token's lanes
        (17 words per 32 columns, 9 per 16 for groups of 16) staged or none."""
        if pass_n < 4 or not w.rowscale:
            return 1.0
        if w.fmt == "q4":
            sub = 16 if w.group == 16 else 32
            lanes = w.cols // sub * (sub // 2 + 1)
            if (quad4 == 1.0 or (w.group != 16 and w.group % 32) or w.cols % w.group or w.cols > 1024
                    or lanes > Q4_LANE_WORDS or pass_n * lanes > stage):
                return 1.0
            return 1.0 - (1.0 - quad4) * (pass_n // 4 * 4) / pass_n
        if quad == 1.0 or w.group not in (16, 32):
            return 1.0
        staged = 4 * min(pass_n // 4, stage // (2 * w.cols))
        return 1.0 - (1.0 - quad) * staged / pass_n

    def rows_cycles(w: TensorSpec) -> float:
        """The rows' multiply-accumulates, per row the scaling: per group a term (conversion, two
        products) and an add, or row-scaled one integer multiply-add per group and three float
        operations per row (kernels_ref.h row_rs); row-scaled q4 in groups of 16, ``q4_g16_cycles``
        per 32 columns more (a board whose lanes then come in sub-blocks of 16)."""
        groups = -(-w.cols // w.group)
        macs = w.rows * w.cols * (q4f if w.fmt == "q4" else 1.0) * quad_factor(w)
        if w.rowscale:
            sub = w.rows * w.cols / 32 * q4_g16 if w.fmt == "q4" and w.group == 16 else 0.0
            return (macs + w.rows * groups) * cpm + sub + w.rows * 3 * cpf
        return macs * cpm + w.rows * groups * 4 * cpf

    def matvec(w: TensorSpec, phase: str, share: float = 1.0) -> float:
        """The activation quantization (per element a product and a code rounded on the bits; per
        group two divisions) and the rows (rows_cycles)."""
        act_groups = 1 if w.rowscale else -(-w.cols // w.group)
        rows_part[phase] += share * rows_cycles(w)
        par_part[phase] += share * w.cols * 2 * cpf
        return rows_cycles(w) + (w.cols * 2 + act_groups * 2 * FLOPS_DIV) * cpf

    def slack(w: TensorSpec) -> float:
        """Core cycles free in w's streamed product while its cores wait for the flash: the cores'
        time at the stream's rate (this token's share of a pass's read) less its rows."""
        return max(0.0, split_cores(prof) * stream_cycles(prof, w.row_stride * w.rows) / pass_n - rows_cycles(w))

    def rms(n: int) -> float:
        return (4 * n + FLOPS_SQRT + FLOPS_DIV) * cpf

    def par(phase: str, cycles: float) -> float:
        """cycles of work hal_parallel splits, in phase."""
        par_part[phase] += cycles
        return cycles

    def after(phase: str, cycles: float) -> float:
        """cycles of work on a product's output rows, in phase: in the products where they take it."""
        (rows_part if phase in rows_after else par_part)[phase] += cycles
        return cycles

    def rms_par(n: int, phase: str, squares: bool = True) -> float:
        """rms(n), its scaling (2 flops an element) split, and its squares (1) where the output is not
        the input; in a pass of several tokens all of it (engine.c rmsnorm: a token's sum on one core)."""
        par(phase, rms(n) if pass_n > 1 else (3 if squares else 2) * n * cpf)
        return rms(n)

    def dequant_row(w: TensorSpec) -> float:
        """kernels.c flm_dequant_row: per element an int-to-float and a product (the profile's
        [compute] dequant_flops in their place, where it measured what the loop around them costs)."""
        return dq_flops * w.cols * cpf + (w.cols * 2 if w.fmt == "q4" else 0)

    out = dict.fromkeys(PHASES, 0.0)
    emb = by["tok_embeddings"]
    out["embed"] = dequant_row(emb)
    P, L = cfg.ple_dim, cfg.n_layers
    if P:   # table row, ple.proj, the scale by 1/sqrt(d), L norms of P, the combine (3 per element)
        out["embed"] += (dequant_row(by["ple.table"]) + matvec(by["ple.proj"], "embed") + L * rms(P)
                         + L * P * 4 * cpf)
    t = pos + 1
    reads = expert_reads(spec, experts)
    E, k = cfg.n_experts, cfg.moe_top_k
    for li in range(cfg.n_layers):
        p = f"layers.{li}."
        c = rms_par(d, "attention") + sum(matvec(by[p + w], "attention") for w in ("attn.wq", "attn.wk", "attn.wv", "attn.wo"))
        c += par("attention", (d // 2 + cfg.kv_dim // 2) * 6 * cpf)                  # RoPE
        if kv == "f32":     # scores, softmax, weighted sum
            c += par("attention", cfg.n_heads * (t * hd * 2 + t * (FLOPS_EXP + 4) + FLOPS_DIV + t * hd * 2) * cpf)
        else:               # int8 or k12 (engine.c attend_int_head): the query quantized per head; per position
            # an integer dot, its score (a conversion, two products), an integer exp (~8 integer ops),
            # w_t (a product) and its rounding, an int8 row times an integer added; per output a
            # conversion and a product; per head 1 / sum p and its product
            c += par("attention", cfg.n_heads * ((2 * t * hd + 8 * t) * cpm
                                                 + (hd * 2 + 2 * FLOPS_DIV + t * 4 + hd * 2 + FLOPS_DIV + 1) * cpf))
            kvq = 2 * cfg.kv_dim * 2 * cpf + 2 * cfg.n_kv_heads * 2 * FLOPS_DIV * cpf   # K, V rows quantized
            c += par("attention", kvq) if pass_n > 1 else kvq
        c += after("attention", d * cpf)                                              # residual (wo's rows)
        out["attention"] += c
        f = rms_par(d, "ffn") + after("ffn", d * cpf)                                  # norm, residual (w2's rows)
        if E:   # the router's f32 dots, the top-k's compares, the softmax of k logits
            f += E * d * 2 * cpf + k * E * cpm + k * (FLOPS_EXP + 2) * cpf + FLOPS_DIV * cpf
        for e, pre in enumerate(cfg.ffn_prefixes(li)):
            share = reads[li][e] if E else 1.0
            silu = hid * (FLOPS_EXP + FLOPS_DIV + 3) * cpf
            one = sum(matvec(by[pre + w], "ffn", share) for w in ("w1", "w3", "w2")) + silu
            # on w1's rows where its product takes it: what fits the cores' wait there overlaps the
            # stream, the rest lengthens the product on both cores (hal_parallel's share)
            fits = min(silu, slack(by[pre + "w1"])) if "ffn" in rows_after else 0.0
            rows_part["ffn"] += share * fits
            par_part["ffn"] += share * (silu - fits)
            if E:   # the gathered input (a copy) and the weighted sum
                one += d * cpm + 2 * d * cpf
            f += share * one
        out["ffn"] += f
        if P:   # gate, gelu * u, proj, post-norm, residual
            out["ple"] += (matvec(by[p + "ple.gate"], "ple") + matvec(by[p + "ple.proj"], "ple") + P * (FLOPS_GELU + 1) * cpf
                           + rms_par(d, "ple", squares=False) + par("ple", d * cpf))
    mode = head_mode(spec, sampling, head)
    v = cfg.n_out
    if mode == "skip":
        return out, rows_part, par_part
    hr = head_rows(spec)
    scan = spec.head_scan
    if mode == "full":
        out["output"] = rms_par(d, "output") + matvec(hr, "output")
        out["sampling"] = v * cpf if sampling == "greedy" else v * (FLOPS_EXP + 8) * cpf
    elif scan is None:   # a greedy step without an index: the whole head and its argmax (integer compares)
        out["output"] = rms_par(d, "output") + matvec(hr, "output") + v * cpm
    else:   # ||x||^2, centre rows, U per tile (2 flops), k rows; the compares are integer (flm_f32_order)
        out["output"] = (rms_par(d, "output") + d * cpm + FLOPS_SQRT * cpf + matvec(by["head.centroids"], "output")
                         + scan.n_tiles * (2 * cpf + 2 * cpm) + matvec(replace(hr, rows=mode), "output")
                         + (2 * mode + tiles_visited(spec, mode)) * cpm)
    return out, rows_part, par_part
