"""The protocol's messages (docs/formats.md section 2) as dataclasses, with the constants their
fields take; host/link/codec.py turns them into payload bytes and back."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

PROTO_VERSION = 5


class MsgType(enum.IntEnum):
    PING = 0x01
    GENERATE = 0x02
    LAYOUT = 0x03
    STOP = 0x04
    RESEND = 0x05
    GENERATE_TEXT = 0x06
    SELFTEST = 0x07
    HELLO = 0x81
    TOKEN = 0x82
    DONE = 0x83
    ERROR = 0x84
    LOGITS = 0x85
    LOG = 0x86
    RESENT = 0x87


PHASES = ("embed", "attention", "ffn", "ple", "output", "sampling", "draft")
TIERS = ("flash", "psram", "sram")
NO_TOKEN = 0xFFFFFFFF
STOP_REASONS = ("max_tokens", "eos", "context_full", "stopped")
ERROR_CODES = {
    1: "bad_frame",
    2: "bad_message",
    3: "bad_image",
    4: "prompt_too_long",
    5: "bad_token",
    6: "busy",
    7: "no_model",
    8: "bad_layout",
    9: "cannot_encode",
    10: "self_check",
}
# HELLO clock kinds: 3 counts emulated instructions (the QEMU boards), no time unit at all
CLOCKS = ("host clock", "chip timer", "emulated timer", "emulated instructions")


def clock_name(clock: int | None) -> str:
    """The HELLO clock source by name; None (no HELLO yet) and unknown codes are shown as is."""
    if clock is not None and 0 <= clock < len(CLOCKS):
        return CLOCKS[clock]
    return f"clock {clock}"


GENERATE_FLAG_LOGITS = 0x1      # a LOGITS frame after every step (implies ALL_LOGITS)
GENERATE_FLAG_SLIDE = 0x2       # a full context slides its window instead of ending the generation
GENERATE_FLAG_ALL_LOGITS = 0x4  # every step computes the whole output layer (never pruned or skipped)
HELLO_FLAG_IMAGE_OK = 0x1
HELLO_FLAG_RESEND = 0x2       # the device keeps recent TOKEN frames and answers RESEND
HELLO_FLAG_TEXT = 0x4         # the device encodes text prompts (GENERATE_TEXT, the text console)
HELLO_FLAG_DRAFT = 0x8        # the device holds a draft model it can speculate with (version 3)
RESEND_MAX = 32               # steps one RESEND may name
RESEND_DONE = 0xFFFFFFFF      # the step number that asks for the generation's DONE
RESENT_STATES = ("idle", "generating", "ended")
SPECULATE = ("none", "lookup", "draft")   # GENERATE speculate: no drafts, prompt lookup, the draft model
PASS_KINDS = ("one", "prefill", "verify")  # TOKEN kind: the forward pass a step came from
GOLDEN_STATES = ("none", "not_run", "exact", "differs")   # HELLO's golden check (docs/formats.md 1.3)
GOLDEN_NO_STEP = 0xFFFF


@dataclass(frozen=True)
class SelfTest:
    """Run every step of the image's golden check now; the device answers LOG and HELLO."""


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Layout:
    """Switch placement without reflashing: one tier (0 flash, 1 psram, 2 sram) per tensor-table
    entry in table order, and the state regions' tiers (the blob header's state_tiers field);
    ``layout_id`` is what the device will report in HELLO (converter.formats.layout_id_of)."""

    layout_id: int
    state_tiers: int
    tiers: bytes


@dataclass(frozen=True)
class Resend:
    """Ask for kept frames of generation ``generation`` again (docs/formats.md section 2.1):
    TOKEN steps, and ``RESEND_DONE`` for its DONE. No steps: a status query."""

    generation: int
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Resent:
    """Ends the device's answer to a RESEND: its generation state and what it did not send."""

    state: str  # one of RESENT_STATES
    generation: int
    steps: int  # TOKEN steps the current/last generation has sent
    first_kept: int  # oldest step still kept
    unavailable: tuple[int, ...]


@dataclass(frozen=True)
class Generate:
    """A generation request: the prompt as token ids (sent as GENERATE) or as UTF-8 text the device
    encodes with its blob's tokenizer.enc section, BOS first as the host's encoder does (sent as
    GENERATE_TEXT; the ids it used come back in the TOKEN frames). ``send_logits``, ``slide`` and
    ``all_logits`` are the GENERATE flags; ``batch``: tokens per prefill pass (0: the device's
    batch); ``speculate``: where drafts come from (SPECULATE); ``draft_k``: drafts per verifying
    pass (0: the batch minus one)."""
    prompt: list[int] | str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    send_logits: bool = False
    slide: bool = False
    all_logits: bool = False
    batch: int = 0
    speculate: str = "none"
    draft_k: int = 0

    @property
    def is_text(self) -> bool:
        return isinstance(self.prompt, str)

    @property
    def whole_heads(self) -> bool:
        """Every step computes the whole output layer (ALL_LOGITS, which LOGITS implies)."""
        return self.all_logits or self.send_logits


GENERATE_FLAGS = GENERATE_FLAG_LOGITS | GENERATE_FLAG_SLIDE | GENERATE_FLAG_ALL_LOGITS


@dataclass(frozen=True)
class Hello:
    proto_version: int
    image_ok: bool
    model_hash: bytes
    layout_id: int
    vocab_size: int
    out_vocab: int  # rows of the output layer: LOGITS carry this many values
    max_seq_len: int
    clock: int
    fw_version: str
    board: str
    can_resend: bool = False  # HELLO flag bit1
    can_encode: bool = False  # HELLO flag bit2
    batch: int = 1            # the most tokens one forward pass runs (version 3)
    can_draft: bool = False   # HELLO flag bit3 (version 3)
    golden: str = "none"      # the golden check: one of GOLDEN_STATES (version 3)
    golden_checked: int = 0   # steps compared
    golden_total: int = 0     # steps the image's golden holds for the KV format in effect
    golden_first_diff: int | None = None   # the first step that differs

    @property
    def clock_name(self) -> str:
        return clock_name(self.clock)

    @property
    def bit_exact(self) -> str:
        """"yes", "no (first step that differs: N)", or why the board cannot say."""
        if self.golden == "exact":
            return f"yes ({self.golden_checked} of {self.golden_total} golden steps)"
        if self.golden == "differs":
            return f"no (first step that differs: {self.golden_first_diff})"
        if self.golden == "not_run":
            return f"not checked yet ({self.golden_total} golden steps; flashlm run --selftest runs them)"
        return "not checked (the image has no golden check for this KV format; re-run flashlm convert)"


@dataclass(frozen=True)
class Token:
    step: int
    pos: int
    in_id: int
    out_id: int | None  # None on the wire is NO_TOKEN (a prompt step whose output is unused)
    us: tuple[int, ...]  # per phase, PHASES order
    bytes_read: tuple[int, ...]  # per tier, TIERS order
    head_rows: int  # rows of the output layer this step computed (0: head skipped; < out_vocab: pruned)
    logits_crc: int
    piece: bytes
    # the forward pass the step came from (version 3): us and bytes_read above are the whole pass's
    pass_index: int = 0        # the step's place in it (its first step: step - pass_index)
    chunk_len: int = 1         # tokens it ran
    chunk_used: int = 1        # steps it produced (a verifying pass: the accepted drafts + 1)
    kind: str = "one"          # PASS_KINDS
    # a mixture of experts (version 4): the experts a layer has (0: a dense model), and per layer the
    # experts this step's token read (largest weight first) and those its pass read (bit e: expert e)
    n_experts: int = 0
    experts: tuple[tuple[int, ...], ...] = ()
    pass_experts: tuple[int, ...] = ()

    @property
    def chunk(self) -> int:
        """The pass's first step."""
        return self.step - self.pass_index


@dataclass(frozen=True)
class Done:
    steps: int
    generated: int
    reason: str  # one of STOP_REASONS
    total_us: int
    phase_us: tuple[int, ...]  # per phase, PHASES order
    # version 3: forward passes, the verifying ones, drafts proposed and accepted, bytes per tier
    # (proposing drafts included), of which proposing drafts read
    passes: int = 0
    verify_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes_read: tuple[int, ...] = (0, 0, 0)
    draft_bytes: tuple[int, ...] = (0, 0, 0)
    # version 5: the main stack's deepest use since boot and its size, bytes (0, 0: not measured)
    stack_peak: int = 0
    stack_size: int = 0


@dataclass(frozen=True)
class Error:
    code: int
    text: str

    @property
    def name(self) -> str:
        return ERROR_CODES.get(self.code, f"error_{self.code}")


@dataclass(frozen=True, eq=False)
class Logits:
    step: int
    values: np.ndarray  # float32, out_vocab entries

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Logits):
            return NotImplemented
        return self.step == other.step and (
            np.asarray(self.values, dtype="<f4").tobytes()
            == np.asarray(other.values, dtype="<f4").tobytes()
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Log:
    text: str


Message = Any  # one of the dataclasses above


@dataclass(frozen=True)
class Frame:
    seq: int
    msg: Message

