"""The one base class of every error flashlm tells a user in one line (exit 2) rather than as a
traceback: a model that cannot be used, a board that fails, a build that breaks, a wrong call.

It lives on converter/'s ground floor because converter/ is the layer firmware/ and host/ both
build on; a module raises its own subclass (ModelError, BuildError, BoardError, ...) and the CLI
needs to know only this one."""


class FlashlmError(Exception):
    """A failure whose message is one line for the user (not a bug)."""
