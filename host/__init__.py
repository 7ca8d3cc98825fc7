"""The host side of flashlm, in rooms by layer, bottom up: errors.py and files.py (the ground),
link/ (the framed serial protocol), session/ (a conversation with a board), boards/ (the boards
flashlm starts, builds for and flashes), model_dir.py (a converted model's folder), output/ (what
is shown and written), commands/ (what each command does, as typed functions: the scripting API)
and cli/ (the ``flashlm`` command line)."""
