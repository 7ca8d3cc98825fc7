"""Instructions per token of the native engine, counted by valgrind's callgrind (deterministic: the
same build, blob and prompt give the same counts on any load, unlike the host clock).

The native board runs under ``valgrind --tool=callgrind`` collecting only inside the engine's step
functions (app_generate.c calls them once per forward pass, one token a pass in this bench's image:
``flm_body_many``, ``flm_head`` / ``flm_head_all`` / ``flm_head_argmax``, ``flm_sample``, ``flm_slide``),
so the protocol, the serial link and the idle loop count nothing.
Two processes per format generate the same prompt, one stopping at its first token and one
``decode`` tokens later; their difference over ``decode`` is the instructions per decode token (at
positions prompt..prompt+decode-1), in total and per function (callgrind_annotate, inclusive for
the step functions, self for the rest). The prompt alone gives instructions per prefill step.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from host.boards.native import start_native_board
from host.link.messages import Generate

from .model import FORMATS, blob_and_firmware, default_quant, prompt_ids, session

STEP_FUNCTIONS = ("flm_body_many", "flm_head", "flm_head_all", "flm_head_argmax", "flm_sample", "flm_slide")
LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(?:(.*):)?([^\s:]+)(?:\s+\[[^\]]*\])?\s*$")


def parse_annotate(text: str) -> dict[str, int]:
    """Function -> instructions from ``callgrind_annotate`` output. A function is listed once per
    source file its instructions come from (code inlined from a header counts under the header),
    and each of those once per spelling of the file's path, with the same count: the largest figure
    per file name, summed over the files."""
    per_file: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m[3] != "TOTALS":
            key = (m[3], (m[2] or "").rsplit("/", 1)[-1])
            per_file[key] = max(per_file.get(key, 0), int(m[1].replace(",", "")))
    out: dict[str, int] = {}
    for (fn, _), n in per_file.items():
        out[fn] = out.get(fn, 0) + n
    return out


def parse_totals(text: str) -> int:
    """The ``totals:`` (or ``summary:``) line of a callgrind output file."""
    m = re.search(r"^(?:totals|summary):\s*(\d+)", text, re.M)
    if not m:
        raise ValueError("no totals line in the callgrind output")
    return int(m[1])


def profile(binary: Path, blob: Path, ids: list[int], new_tokens: int, out: Path, all_logits: bool = False) -> dict:
    """One valgrind run generating ``new_tokens`` after ``ids`` (``all_logits``: the GENERATE flag, every
    step's whole head instead of the pruned greedy scan): total, inclusive and self counts."""
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
               *(f"--toggle-collect={f}" for f in STEP_FUNCTIONS)]
    board = start_native_board(binary, blob, timeout=120, wrapper=wrapper)
    try:
        with session(board.port, 120, 120) as s:
            res = s.generate(Generate(ids, new_tokens, all_logits=all_logits))
    finally:
        board.stop(timeout=120)       # callgrind writes its file as the board exits (SIGTERM)
    total = parse_totals(out.read_text())
    if total == 0:
        raise RuntimeError(f"callgrind counted nothing: none of {', '.join(STEP_FUNCTIONS)} ran in {binary}")

    def annotate(*opts) -> dict[str, int]:
        r = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", *opts, str(out)],
                           capture_output=True, text=True, check=True)
        return parse_annotate(r.stdout)
    incl = annotate("--inclusive=yes")
    return dict(steps=len(res.tokens), total=total, inclusive={f: incl.get(f, 0) for f in STEP_FUNCTIONS},
                self=annotate(), head_rows=[t.head_rows for t in res.generated_steps])


def decode_figures(first: dict, longer: dict, decode: int, prompt_len: int) -> dict:
    """Per decode token: the difference of two runs over the decode tokens between them (and the
    head rows those tokens computed, on average); per prefill step: the first run's ``flm_body_many`` over
    its prompt steps."""
    per = lambda a, b: (b - a) / decode
    funcs = {f for f in set(first["self"]) | set(longer["self"]) if longer["self"].get(f, 0) != first["self"].get(f, 0)}
    return dict(
        ir_per_decode_token=per(first["total"], longer["total"]),
        inclusive_per_decode_token={f: per(first["inclusive"][f], longer["inclusive"][f]) for f in STEP_FUNCTIONS},
        self_per_decode_token={f: per(first["self"].get(f, 0), longer["self"].get(f, 0)) for f in sorted(funcs)},
        ir_per_prefill_step=first["inclusive"]["flm_body_many"] / prompt_len,
        ir_prompt_total=first["total"], decode_tokens=decode, prompt_tokens=prompt_len,
        head_rows_per_decode_token=sum(longer["head_rows"][-decode:]) / decode)


def callgrind_missing() -> str | None:
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install valgrind)"
    return None


def section(work: Path, decode: int = 32) -> dict:
    why = callgrind_missing()
    if why:
        raise RuntimeError(why)
    out = {}
    for fmt in FORMATS:
        qm = default_quant(fmt)
        blob, fw = blob_and_firmware(qm, "native", work / f"cg-{fmt}")
        ids = prompt_ids(qm)
        first = profile(fw.binary, blob, ids, 1, work / f"cg-{fmt}" / "first.out")
        longer = profile(fw.binary, blob, ids, 1 + decode, work / f"cg-{fmt}" / "longer.out")
        out[f"callgrind_native_{fmt}"] = decode_figures(first, longer, decode, len(ids))
    out["ratios"] = {"callgrind q4/q8 instructions per decode token":
                     out["callgrind_native_q4"]["ir_per_decode_token"] / out["callgrind_native_q8"]["ir_per_decode_token"]}
    return out
