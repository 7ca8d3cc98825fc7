"""The framed serial protocol (docs/formats.md section 2), host side, bottom up.

Wire: every frame is ``COBS(u8 type | u16 seq | payload | u32 crc32)`` followed by one ``0x00``.

* ``cobs.py`` -- canonical COBS (byte-identical to the firmware's streaming encoder) and one raw
  frame (type, seq, payload) <-> its delimited bytes;
* ``messages.py`` -- the messages as dataclasses, and the constants their fields take;
* ``codec.py`` -- a message <-> (type, payload bytes);
* ``frames.py`` -- ``FrameDecoder``: a received byte stream in, ``Frame`` objects out, with counters;
* ``port.py`` -- ``open_port`` and ``Link``: frames over a pyserial port;
* ``faultproxy.py`` -- a pty between host and board that damages the bytes, for testing.
"""
