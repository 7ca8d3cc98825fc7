"""Predicted speculative decoding on a board: expected tokens per verifying pass from per-position
acceptance, and µs and bytes per emitted token (the draft model's own passes included) against
plain greedy decoding. A prediction, labelled as one wherever it is shown.

Acceptance comes from a calibration — the NumPy reference (the device's numerics, reference.generate)
decoding prompts of held-out text greedily with the proposer (prompt lookup or the draft model),
counting per draft position i how many verifications reached it (drafts 1..i-1 accepted) and how
many accepted it — or is supplied. With conditional rates p_1..p_k a verification of k drafts emits
E(k) = 1 + sum_i prod_{j<=i} p_j tokens; prompt lookup finds no match at some positions (a plain
pass then), the share ``proposed`` of passes that had drafts.

Greedy-exact speculation emits plain greedy decoding's tokens, so only time and bytes change: a
verification reads every weight once for k+1 tokens and computes every token's whole head
(firmware/app/app_generate.c), so it pays where the pass is bound by the bytes it reads (its
k+1 tokens cost little more than one) and not where it is bound by arithmetic (k+1 times one).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import costmodel as C
from .ir import ModelError
from .passcost import HEAD_ALL, Placement, PassPrediction, predict_pass
from .reference import PASS_VERIFY, generate

MODES = ("lookup", "draft")


@dataclass(frozen=True)
class Acceptance:
    """Per draft position i (1-based) the rate p_i at which draft i is accepted when drafts 1..i-1
    were; positions past the last rate take the last one."""
    rates: tuple
    proposed: float = 1.0          # share of decoding passes that had drafts (prompt lookup may find none)
    source: str = "supplied"
    reached: tuple = ()            # evidence: verifications that reached each position
    accepted: tuple = ()

    def rate(self, i: int) -> float:
        return self.rates[min(i, len(self.rates)) - 1]

    def all_accepted(self, k: int) -> float:
        p = 1.0
        for i in range(1, k + 1):
            p *= self.rate(i)
        return p

    def tokens_per_verify(self, k: int) -> float:
        """E(k): tokens a verification of k drafts emits on average (its last step's own token included)."""
        e, p = 1.0, 1.0
        for i in range(1, k + 1):
            p *= self.rate(i)
            e += p
        return e


def parse_acceptance(text: str) -> Acceptance:
    """``--acceptance 0.6`` (every position) or ``0.8,0.6,0.5`` (per position; later ones take the last)."""
    try:
        rates = tuple(float(v) for v in str(text).split(","))
    except ValueError:
        rates = ()
    if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
        raise ModelError(f"--acceptance {text!r}: give a rate in 0..1, or rates per draft position "
                         f"separated by commas (e.g. 0.8,0.6,0.5)")
    return Acceptance(rates)


def acceptance_from_steps(runs, k: int, source: str) -> Acceptance:
    """Per-position acceptance from reference.generate records of several runs, (prompt length,
    steps) each: every verification (kind PASS_VERIFY: chunk_len - 1 drafts, chunk_used - 1 accepted)
    counts toward the positions it reached; a decoding pass (the one holding the prompt's last token,
    and every later one) without drafts counts toward ``proposed`` — but a run's last pass, which has
    no token left to draft for."""
    reached, acc = [0] * k, [0] * k
    verify = plain = 0
    for n_prompt, steps in runs:
        passes = {}
        for s in steps:
            passes.setdefault(s["chunk"], s)
        for first, s in passes.items():
            if s["kind"] == PASS_VERIFY:
                verify += 1
                drafts, used = s["chunk_len"] - 1, s["chunk_used"] - 1
                for i in range(min(drafts, used + 1)):
                    reached[i] += 1
                    acc[i] += i < used
            elif n_prompt - 1 <= first < max(passes):
                plain += 1
    if not verify:
        raise ModelError(f"the calibration ({source}) verified no drafts: nothing to measure acceptance on")
    rates = tuple(a / r if r else 0.0 for a, r in zip(acc, reached))
    return Acceptance(rates, verify / (verify + plain), source, tuple(reached), tuple(acc))


def calibrate(qm, mode: str, k: int, prompts: list[list[int]], new_tokens: int, source: str) -> Acceptance:
    """Acceptance of ``mode`` (prompt lookup, or qm's draft model) with k drafts a verification, from
    the reference decoding each prompt greedily for ``new_tokens`` tokens (exactly what a board does)."""
    if mode not in MODES:
        raise ModelError(f"speculation must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "draft" and qm.draft is None:
        raise ModelError("the model carries no draft model (flashlm convert --draft)")
    runs = [(len(ids), generate(qm, ids, new_tokens, batch=k + 1, speculate=mode, draft_k=k)) for ids in prompts]
    return acceptance_from_steps(runs, k, source)


def prompt_windows(ids: list[int], n: int, length: int, bos: int | None) -> list[list[int]]:
    """n prompts of ``length`` tokens cut evenly from a token sequence (each starting with BOS, if any)."""
    body = length - (bos is not None)
    if len(ids) < body or n < 1:
        raise ModelError(f"the calibration text has {len(ids)} tokens; {n} prompts of {length} need more")
    step = max(1, (len(ids) - body) // n)
    return [([bos] if bos is not None else []) + ids[i * step:i * step + body] for i in range(n)]


# -------------------------------------------------------------------------------------------------
# the prediction

def draft_cost(dpl: Placement, pos: int, k: int, catch_up: int = 1, tm=None) -> PassPrediction:
    """Proposing k drafts for the token at ``pos`` (app_speculate.c app_draft_propose): the draft model
    catches up with the context (``catch_up`` tokens ending at pos, in passes of its batch) and scans
    its head, then runs one token a step for the other k-1 drafts, each with its head scan (greedy:
    at its upper bound, every row)."""
    tm = tm or dpl.tier_models
    first = pos + 1 - catch_up
    passes = []
    p = first
    while p <= pos:
        n = min(dpl.batch, pos + 1 - p)
        passes.append(predict_pass(dpl, p, n, None if p + n > pos else "skip", tm=tm))
        p += n
    for i in range(1, k):
        passes.append(predict_pass(dpl, pos + i, 1, None, tm=tm))
    total = passes[0]
    for q in passes[1:]:
        total = total + q
    return total


@dataclass(frozen=True)
class PassRecord:
    """A forward pass a board ran (or the reference's generate describes): its first position, tokens,
    the steps it produced, its kind (reference.PASS_*) and its output layer (passcost's terms)."""
    pos: int
    tokens: int
    steps: int
    kind: str
    head: object


def predict_run(pl: Placement, records, draft: Placement | None = None,
                sampling: str = "greedy") -> list[tuple[PassPrediction, PassPrediction | None]]:
    """Each pass of a generation predicted at its own positions, with the draft model's drafting before
    each verification when ``draft`` is its placement: app_speculate.c catches the draft up from where
    its cache stops (the whole prompt before the first) and, after a verification that produced u
    steps of k drafts, keeps min(k, u) of the positions it drafted (a window slide is not modelled)."""
    tm = pl.tier_models
    dtm = draft.tier_models if draft is not None else None
    dpos, out = 0, []
    for r in records:
        d = None
        if draft is not None and r.kind == PASS_VERIFY:
            k = r.tokens - 1
            d = draft_cost(draft, r.pos, k, r.pos + 1 - dpos, tm=dtm)
            dpos = r.pos + min(k, r.steps)
        out.append((predict_pass(pl, r.pos, r.tokens, r.head, sampling, tm=tm), d))
    return out


@dataclass
class SpecQuote:
    """Speculative decoding with k drafts a verification on a board (predicted), per emitted token,
    against plain greedy decoding (one token a pass, its head's pruned scan at its upper bound)."""
    k: int
    acceptance: Acceptance
    plain: PassPrediction          # a plain decoding pass
    verify: PassPrediction         # a verification of k drafts (k+1 tokens, every token's head)
    draft: PassPrediction | None   # proposing them with the draft model (None: prompt lookup, not costed)

    @property
    def tokens_per_verify(self) -> float:
        return self.acceptance.tokens_per_verify(self.k)

    @property
    def tokens_per_pass(self) -> float:
        h = self.acceptance.proposed
        return h * self.tokens_per_verify + (1 - h)

    def _per_pass(self, f) -> float:
        h = self.acceptance.proposed
        spec = f(self.verify) + (f(self.draft) if self.draft is not None else 0.0)
        return h * spec + (1 - h) * f(self.plain)

    @property
    def us_per_token(self) -> float:
        return self._per_pass(lambda p: p.total_us) / self.tokens_per_pass

    @property
    def plain_us_per_token(self) -> float:
        return self.plain.total_us

    @property
    def speedup(self) -> float:
        """Emitted tokens per second against plain greedy decoding (predicted)."""
        return self.plain_us_per_token / self.us_per_token

    @property
    def pass_cost_ratio(self) -> float:
        """A verification of k+1 tokens (and its drafting) in plain passes: the tokens per pass that break even."""
        return (self.verify.total_us + (self.draft.total_us if self.draft is not None else 0.0)) / self.plain.total_us

    def bytes_per_token(self) -> dict:
        return {t: self._per_pass(lambda p, t=t: p.bytes_read[t]) / self.tokens_per_pass for t in C.TIERS}

    @property
    def draft_us_per_token(self) -> float:
        if self.draft is None:
            return 0.0
        return self.acceptance.proposed * self.draft.total_us / self.tokens_per_pass


def predict_speculation(pl: Placement, acceptance: Acceptance, k: int, pos: int,
                        draft: Placement | None = None) -> SpecQuote:
    """Speculation with k drafts at decode position ``pos`` on placement ``pl`` (its batch must hold
    k+1 tokens); ``draft``: the draft model's placement (draft_placement), else prompt lookup."""
    S = pl.spec.config.max_seq_len
    if k < 1 or pos + k + 1 > S:
        raise ModelError(f"{k} drafts at position {pos} do not fit the context of {S}")
    tm = pl.tier_models
    plain = predict_pass(pl, pos, 1, None, tm=tm)
    verify = predict_pass(pl, pos, k + 1, HEAD_ALL, tm=tm)
    d = None
    if draft is not None:   # the catch-up is one token, or two after a verification that accepted all
        pa = acceptance.all_accepted(k)
        d = draft_cost(draft, pos, k, 1).scaled(1 - pa) + draft_cost(draft, pos, k, 2).scaled(pa)
    return SpecQuote(k, acceptance, plain, verify, d)
