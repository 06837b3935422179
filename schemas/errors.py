"""The error types for what the user can fix: a missing file, a bad setting, an input without the
columns a job needs (UserError); a stage that cannot run at all (StageDown). The CLI prints them as one
line (exit 2); any other exception is a bug in ragsift and keeps its traceback."""


class UserError(ValueError):
    """Bad input, configuration or environment, said in words the user can act on."""


class StageDown(RuntimeError):
    """A stage has no replica that can run (their actors cannot start): the run stops; committed
    output is kept and the same command resumes once the cause is fixed."""
