"""The boards flashlm talks to, below the session: the native virtual board (native.py), the
emulated RP2040 (emulated.py), the QEMU boards of the ESP32 family's instruction sets (qemu.py),
choosing and starting any of them (virtual.py), firmware builds a run reuses (builds.py), and
flashing a real board and finding its port (flash.py)."""
