"""The errors every package may raise and catch, in a module that imports nothing, so that the
cluster and CLI code can name them without loading the ML core."""


class ConfigError(ValueError):
    """A user mistake in a config file, a sweep file or a command's arguments: the message names
    the key and the value, and the command exits 2 before anything is created."""
