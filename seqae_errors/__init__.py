"""The errors every package may raise and catch, in a module that imports nothing, so that the
cluster and CLI code can name them without loading the ML core."""


class ConfigError(ValueError):
    """A user mistake in a config file, a sweep file or a command's arguments: the message names
    the key and the value, and the command exits 2 before anything is created."""


class StorageUnreachable(RuntimeError):
    """A store a sweep lives in (its Optuna study's database) did not answer for as long as seqae
    waits out an outage: the message names the store and what to do, and the command exits 75
    (EX_TEMPFAIL: try again later) without a traceback."""


def one_line(exc: BaseException) -> str:
    """An exception's text folded onto one line of at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
