"""Receiving frames: ``FrameDecoder`` turns a byte stream into ``Frame`` objects, with counters
in ``stats``."""
from __future__ import annotations

from dataclasses import dataclass, field

from .codec import decode_payload
from .cobs import MAX_ENCODED, FrameError, ProtocolError, decode_raw_frame
from .messages import Frame, MsgType

_KNOWN_TYPES = frozenset(int(t) for t in MsgType)
RESYNC_WINDOW = 8192  # how far into a failing chunk to look for a frame glued to junk
_RESYNC_TRIES = 64


@dataclass
class DecoderStats:
    frames: int = 0  # frames delivered
    bad_crc: int = 0  # valid COBS, CRC mismatch
    bad_cobs: int = 0  # invalid COBS, shorter than 7 bytes, or longer than MAX_FRAME
    bad_message: int = 0  # good frame, payload not a valid message (unknown type, bad length)
    junk_bytes: int = 0  # bytes skipped outside frames (before the first frame, boot logs)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (expected seq, got seq)
    resets: int = 0  # HELLO with seq 0 after earlier traffic: the device rebooted

    @property
    def bad_frames(self) -> int:
        return self.bad_crc + self.bad_cobs + self.bad_message


class FrameDecoder:
    """Turns a received byte stream into ``Frame`` objects.

    Bytes up to each 0x00 delimiter form a candidate frame.  Until the first good frame,
    anything that does not decode counts as ``junk_bytes`` (boot logs, a partial frame at
    connect); after it, each candidate that does not decode is one ``bad_cobs`` / ``bad_crc``.
    A candidate that fails to decode is also searched for a valid frame glued to the end of junk
    (a boot log followed by HELLO with no delimiter in between): that frame is delivered and the
    bytes before it are skipped as above.  A candidate longer than any valid frame keeps only its
    last ``MAX_ENCODED`` bytes.

    Seq: each good frame is checked against the previous seq + 1 (mod 65536); a mismatch is
    recorded in ``stats.gaps``, except a HELLO with seq 0, which is counted as a reset.
    """

    def __init__(self) -> None:
        self.stats = DecoderStats()
        self._buf = bytearray()
        self._dropped = 0  # bytes cut from the front of an oversize candidate
        self._synced = False
        self._last_seq: int | None = None

    @property
    def last_seq(self) -> int | None:
        return self._last_seq

    def feed(self, data: bytes) -> list[Frame]:
        data = bytes(data)
        out: list[Frame] = []
        pos = 0
        while True:
            z = data.find(0, pos)
            if z < 0:
                self._append(data[pos:])
                return out
            self._append(data[pos:z])
            self._candidate(out)
            pos = z + 1

    def _append(self, piece: bytes) -> None:
        if not piece:
            return
        self._buf += piece
        extra = len(self._buf) - MAX_ENCODED
        if extra > 0:
            del self._buf[:extra]
            self._dropped += extra

    def _candidate(self, out: list[Frame]) -> None:
        chunk = bytes(self._buf)
        dropped = self._dropped
        self._buf.clear()
        self._dropped = 0
        if not chunk and not dropped:
            return  # empty frame: idle delimiter
        try:
            msg_type, seq, payload = decode_raw_frame(chunk)
            skipped = dropped
        except FrameError as err:
            found = self._resync(chunk)
            if found is None:
                self._skip(len(chunk) + dropped, "crc" if err.kind == "crc" and not dropped
                           else "cobs")
                return
            start, (msg_type, seq, payload) = found
            skipped = dropped + start
        if skipped:
            self._skip(skipped, "cobs")
        self._accept(msg_type, seq, payload, out)

    def _skip(self, n: int, kind: str) -> None:
        """Bytes that are not a frame: junk before the first good frame, else one bad frame."""
        if not self._synced:
            self.stats.junk_bytes += n
        elif kind == "crc":
            self.stats.bad_crc += 1
        else:
            self.stats.bad_cobs += 1

    @staticmethod
    def _resync(chunk: bytes):
        n = len(chunk)
        reach: bytearray | None = None
        tries = 0
        for s in range(1, min(n - 1, RESYNC_WINDOW)):
            # A frame starts with a code byte >= 2 followed by a known message type.
            if chunk[s] < 2 or chunk[s + 1] not in _KNOWN_TYPES:
                continue
            if reach is None:  # reach[i]: the COBS block chain from i lands exactly on n
                reach = bytearray(n + 1)
                reach[n] = 1
                for i in range(n - 1, 0, -1):
                    j = i + chunk[i]
                    if j <= n and reach[j]:
                        reach[i] = 1
            if not reach[s]:
                continue
            try:
                return s, decode_raw_frame(chunk[s:])
            except FrameError:
                tries += 1
                if tries >= _RESYNC_TRIES:
                    return None
        return None

    def _accept(self, msg_type: int, seq: int, payload: bytes, out: list[Frame]) -> None:
        st = self.stats
        self._synced = True
        if self._last_seq is not None:
            expected = (self._last_seq + 1) & 0xFFFF
            if seq != expected:
                if seq == 0 and msg_type == MsgType.HELLO:
                    st.resets += 1
                else:
                    st.gaps.append((expected, seq))
        self._last_seq = seq
        try:
            msg = decode_payload(msg_type, payload)
        except ProtocolError:
            st.bad_message += 1
            return
        st.frames += 1
        out.append(Frame(seq, msg))
