"""The recipes ``flashlm eval --fidelity`` and ``make bench`` measure against fp32 (converter/fidelity.py),
and the run that measures each of them on one probe: text and prompts fp32 wrote once."""
from __future__ import annotations

from dataclasses import dataclass

from . import headcalib, qat
from .calibrate import input_moments, resolve as resolve_calibration
from .fidelity import fp32_greedy, greedy_agreement, sample_text, teacher_forced
from .formats import KV_DEFAULT, row_stride
from .ir import ModelIR, QTensor, QuantModel
from .quantize import DEFAULT_GROUP, HEAD_GROUP_Q4, HEAD_GROUP_Q8, quantize


@dataclass(frozen=True)
class Recipe:
    label: str
    fmt: str
    group_size: int = 32            # q8's default (convert's for q4 is DEFAULT_GROUP["q4"])
    scales: str | None = None       # None: convert's default (row scales)
    kv: str = KV_DEFAULT              # convert's default (k12)
    calibrate: str = "auto"         # convert's --calibrate (auto: gptq for q8, qat for q4)
    quant: tuple[str, ...] = ()     # convert's --quant overrides

    @property
    def rounding(self) -> str:
        return resolve_calibration(self.calibrate, self.fmt, self.scales)

    def describe(self) -> str:
        head = f" (head g{min(self.group_size, HEAD_GROUP_Q8 if self.fmt == 'q8' else HEAD_GROUP_Q4)})"
        return (f"{self.fmt} g{self.group_size}{head}, {self.scales or 'row'} scales, {self.kv} KV"
                + (f", {self.rounding}" if self.rounding != "none" else "")
                + "".join(f", {q}" for q in self.quant))


# convert's defaults first, then the variants that show where each one's error comes from (a QAT recipe takes
# minutes: only q4's default trains)
RECIPES = (
    Recipe("q8 default", "q8"),
    Recipe("q8, int8 KV", "q8", kv="int8"),
    Recipe("q8, f32 KV", "q8", kv="f32"),
    Recipe("q8, nearest rounding", "q8", calibrate="none"),
    Recipe("q8, nearest rounding, f32 scales, f32 KV", "q8", scales="f32", kv="f32", calibrate="none"),
    Recipe("q4 default", "q4", DEFAULT_GROUP["q4"]),
    Recipe("q4, nearest rounding", "q4", DEFAULT_GROUP["q4"], calibrate="none"),
    Recipe("q4, nearest rounding, int8 KV", "q4", DEFAULT_GROUP["q4"], kv="int8", calibrate="none"),
    Recipe("q4, GPTQ", "q4", DEFAULT_GROUP["q4"], calibrate="gptq"),
    Recipe("q4 g32, q8 embedding, nearest rounding (the default until stop 29)", "q4", 32, calibrate="none",
           quant=("tok_embeddings=q8:32", "head=q8:32")),
    Recipe("q4, f32 scales g8, f32 KV", "q4", group_size=8, scales="f32", kv="f32", calibrate="none"),
)


def bits_per_weight(qm: QuantModel) -> float:
    """The quantized matrices' blob bytes (codes, scales, multipliers) * 8 over their weights."""
    mats = [t for t in qm.tensors.values() if isinstance(t, QTensor)]
    size = sum(t.shape[0] * row_stride(t.fmt, t.shape[1], t.group_size, t.scale16, t.rowscale) for t in mats)
    return 8.0 * size / max(sum(t.codes.size for t in mats), 1)


def measure(ir: ModelIR, recipes=RECIPES, positions: int = 2000, prompts: int = 16, tokens: int = 200,
            seed: int = 0, say=None) -> dict:
    """Every recipe's teacher-forced measure over ``positions`` predictions of fp32's sampled text and
    its greedy agreement over ``prompts`` prompts of ``tokens`` tokens; ``say(text)`` before each step."""
    say = say or (lambda text: None)
    say(f"fp32: sampling {positions} positions of text")
    probe = sample_text(ir, positions, seed)
    say(f"fp32: greedy continuations of {prompts} prompts")
    fp32_greedy(ir, probe, prompts, tokens)
    moments = None
    rows = []
    for r in recipes:
        say(f"{r.label} ({r.describe()})")
        if r.rounding == "gptq" and moments is None:
            moments = input_moments(ir)
        qm = quantize(ir, r.fmt, r.group_size, r.quant, scales=r.scales,
                      moments=moments if r.rounding == "gptq" else None)
        if r.rounding == "qat":
            trained, grids = qat.train(ir, qm)
            qm = quantize(trained, r.fmt, r.group_size, r.quant, scales=r.scales, grids=grids)
        qm.head_index = headcalib.calibrate(qm)[0]
        rows.append(dict(label=r.label, recipe=r.describe(), bits_per_weight=bits_per_weight(qm),
                         **teacher_forced(qm, r.kv, probe), greedy=greedy_agreement(qm, r.kv, probe)))
    return dict(positions=probe.positions, sequences=len(probe.seqs), prompts=prompts,
                tokens=len(probe.fp_greedy[0]) if probe.fp_greedy else 0, seed=seed, rows=rows)
