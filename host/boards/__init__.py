"""The boards flashlm talks to, below the session: the native virtual board (native.py), the
emulated RP2040 (emulated.py), choosing and starting either (virtual.py), firmware builds a run
reuses (builds.py), and flashing a real board and finding its port (flash.py)."""
