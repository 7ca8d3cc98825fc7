"""The ESP32 family's instruction sets in QEMU (issue 20, phase A): the engine cross-compiled for the
ESP32-C3's rv32imc and the ESP32-S3's Xtensa LX7 and run on QEMU's generic machines, serial on a
pty, clock in emulated instructions. build.py builds an image, board.py starts it, check.py proves
it bit-exact against the NumPy reference and the native board, probe.py measures the kernels.
NOTES-phaseA.md at the project root says what works, how, and what phase B does with it."""
