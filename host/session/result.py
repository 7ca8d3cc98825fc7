"""What one generation produced, as it arrived (``RunResult``), and the link counters beside it."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..link.frames import DecoderStats
from ..link.messages import PHASES, TIERS, Done, Generate, Hello, clock_name


def stats_dict(stats: DecoderStats) -> dict:
    """The link's decoder counters as a flat dict of numbers (``gaps`` as a count)."""
    return {"frames": stats.frames, "bad_crc": stats.bad_crc, "bad_cobs": stats.bad_cobs,
            "bad_message": stats.bad_message, "junk_bytes": stats.junk_bytes, "gaps": len(stats.gaps),
            "resets": stats.resets, "bad_frames": stats.bad_frames}


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before[k] for k, v in after.items()}


@dataclass
class RunResult:
    """Everything one generation produced, as it arrived."""
    hello: Hello | None                                  # None if generate ran before a handshake
    request: Generate                                    # what was asked (the first request of a recovered run)
    prompt_ids: list[int] = field(default_factory=list)  # the ids the steps ran (a text prompt's: from the TOKEN frames)
    tokens: list = field(default_factory=list)          # protocol Token, in step order
    done: Done | None = None
    missing_steps: list[int] = field(default_factory=list)
    duplicate_steps: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)            # link stats after the run (cumulative)
    run_stats: dict = field(default_factory=dict)        # link stats during this run only
    gap_pairs: list = field(default_factory=list)        # (expected seq, got seq) during this run
    wall_s: float = 0.0
    interrupted: bool = False
    logits: dict = field(default_factory=dict)           # step -> list of floats
    logs: list[str] = field(default_factory=list)
    board_name: str = ""
    harness: list = field(default_factory=list)          # emulator's per-step read counts (rp2040-emu)
    # per forward pass (its first step), the row padding per tier the engine counts and the harness cannot
    # see (candidates; boards.emulated.unloaded_padding); None: not known, the counts are not compared
    padding: dict | None = field(default_factory=dict)
    generation: int | None = None                        # the device's number for it (RESEND)
    resent_steps: list[int] = field(default_factory=list)   # lost, then recovered by RESEND
    resend_requests: int = 0
    conflicts: list[int] = field(default_factory=list)   # a second copy of a step differed (never expected)
    device_errors: list[str] = field(default_factory=list)  # ERRORs that did not end the run (bad_frame)
    notes: list[str] = field(default_factory=list)
    recoveries: list[dict] = field(default_factory=list)   # reconnects / regenerations (generate_with_recovery)
    done_from_host: bool = False                         # DONE totals summed by the host over merged runs

    @property
    def prompt_text(self) -> str | None:
        """The prompt, when the device encoded it (GENERATE_TEXT)."""
        return self.request.prompt if self.request.is_text else None

    @property
    def all_logits(self) -> bool:
        """GENERATE flag ALL_LOGITS (or LOGITS): every step computed the whole head."""
        return self.request.whole_heads

    @property
    def frame_gaps(self) -> int:
        return self.run_stats.get("gaps", 0)

    @property
    def bad_frames(self) -> int:
        return self.run_stats.get("bad_frames", 0)

    @property
    def prompt_steps(self) -> list:
        """Steps whose output is unused (the prompt, except its last token)."""
        return [t for t in self.tokens if t.out_id is None]

    @property
    def generated_steps(self) -> list:
        """Steps that produced a token (the last prompt step and every generated one)."""
        return [t for t in self.tokens if t.out_id is not None]

    @property
    def generated_ids(self) -> list[int]:
        return [t.out_id for t in self.generated_steps]

    @property
    def text_bytes(self) -> bytes:
        return b"".join(t.piece for t in self.generated_steps)

    @property
    def board(self) -> str:
        return (self.hello.board if self.hello is not None else "") or self.board_name or "?"

    @property
    def clock(self) -> str:
        return clock_name(self.hello.clock if self.hello is not None else None)

    @property
    def complete(self) -> bool:
        return self.done is not None and not self.missing_steps


def prompt_of(tokens) -> list[int]:
    """The prompt ids a generation's TOKEN frames show (step s reads prompt id s, up to the first
    step that produces a token), or [] while one of those steps is missing."""
    ids = []
    for i, t in enumerate(sorted(tokens, key=lambda t: t.step)):
        if t.step != i:
            return []
        ids.append(t.in_id)
        if t.out_id is not None:
            return ids
    return []


def step_share(t) -> dict:
    """A step's share of the forward pass it came from (a TOKEN's us and bytes_read are the whole
    pass's, repeated in each step it produced): the pass's figures divided by those steps, so that
    sums over steps count every pass once."""
    k = 1.0 / max(1, t.chunk_used)
    verify = k if t.kind == "verify" else 0.0
    return {"us": [u * k for u in t.us], "bytes": [b * k for b in t.bytes_read],
            "passes": k, "verify_passes": verify, "drafted": (t.chunk_len - 1) * verify,
            "accepted": (t.chunk_used - 1) * verify}


def done_from_steps(tokens, steps: int, reason: str):
    """A DONE summed by the host over the steps it has (merged runs): every pass counted once (the
    split of drafting's bytes is not in TOKEN frames: 0)."""
    sh = [step_share(t) for t in tokens]

    def total(key, i=None):
        return round(sum(x[key] if i is None else x[key][i] for x in sh))
    return Done(steps, sum(t.out_id is not None for t in tokens), reason,
                  round(sum(sum(x["us"]) for x in sh)), tuple(total("us", i) for i in range(len(PHASES))),
                  total("passes"), total("verify_passes"), total("drafted"), total("accepted"),
                  tuple(total("bytes", i) for i in range(len(TIERS))), (0, 0, 0))

