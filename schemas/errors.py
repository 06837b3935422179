"""The one error type for what the user can fix: a missing file, a bad setting, an input without the
columns a job needs. The CLI prints it as one line (exit 2); any other exception is a bug in
ragsift and keeps its traceback."""


class UserError(ValueError):
    """Bad input, configuration or environment, said in words the user can act on."""
