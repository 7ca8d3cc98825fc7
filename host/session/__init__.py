"""A conversation with one board, above the link: ``Session`` (handshake, model check, LAYOUT,
SELFTEST, generate) collects a generation's frames (collect.py) and survives failures as a
``Policy`` says (recovery.py) into a ``RunResult`` (result.py); errors.py names what goes wrong and
checks.py what a board cannot run."""
