"""Host side of the framed serial protocol (docs/formats.md section 2): one import for everything.

Wire: every frame is ``COBS(u8 type | u16 seq | payload | u32 crc32)`` followed by one ``0x00``.
All integers are little-endian, floats are IEEE-754 binary32.

Layers, bottom up, each in its own module:

* ``host/cobs.py`` -- ``cobs_encode`` / ``cobs_decode`` (canonical COBS, byte-identical to the
  firmware's streaming encoder) and ``encode_raw_frame`` / ``decode_raw_frame`` (type, seq,
  payload <-> one delimited frame);
* ``host/messages.py`` -- message dataclasses <-> (type, payload): ``encode_payload`` /
  ``decode_payload``, ``encode_frame``;
* ``host/link.py`` -- ``FrameDecoder`` (a byte stream in, ``Frame`` objects out, with counters in
  ``stats``) and ``Link`` (a decoder plus a transmit seq over a pyserial-like port).
"""
from .cobs import (  # noqa: F401
    MAX_FRAME, FRAME_OVERHEAD, MAX_PAYLOAD, cobs_max_encoded, MAX_ENCODED, ProtocolError, FrameError,
    cobs_encode, cobs_decode, encode_raw_frame, decode_raw_frame,
)
from .messages import (  # noqa: F401
    PROTO_VERSION, MsgType, PHASES, TIERS, NO_TOKEN, STOP_REASONS, ERROR_CODES, CLOCKS, GENERATE_FLAG_LOGITS,
    GENERATE_FLAG_SLIDE, GENERATE_FLAG_ALL_LOGITS, HELLO_FLAG_IMAGE_OK, HELLO_FLAG_RESEND, HELLO_FLAG_TEXT, HELLO_FLAG_DRAFT,
    RESEND_MAX, RESEND_DONE, RESENT_STATES, SPECULATE, PASS_KINDS, GOLDEN_STATES, Ping, SelfTest, Stop, Layout, Resend, Resent,
    Generate, GenerateText,
    GENERATE_FLAGS, generate_flags, Hello, Token, Done, Error, Logits, Log, Message, Frame, encode_payload,
    encode_frame, decode_payload,
)
from .link import (  # noqa: F401
    RESYNC_WINDOW, DecoderStats, FrameDecoder, Link,
)
