"""The ``seqae`` command line: it parses a verb's arguments, calls :mod:`seqae.api` (or the package the
verb is) and prints what it returns; nothing imports it but ``python -m seqae``."""
