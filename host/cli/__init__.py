"""The ``flashlm`` command line: main.py parses and dispatches; one module per command declares its
options (shared groups in options.py) and turns them into the typed call of host/commands/."""
