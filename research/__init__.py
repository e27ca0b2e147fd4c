"""seqae's research beside the product, not installed with it: the experiments whose outputs are
the docs' claims (the evidence table, the replays of search methods on it, the frontier, the search
against the recipe), each run as ``python -m research.<module>``, and their tables (``tables/``).
They use seqae as a user does, through ``seqae.api``, and simulate sweeps on recorded curves
through the one seam the sweep service offers for it (:mod:`sweeps.running.simulation`)."""

from pathlib import Path

TABLES = Path(__file__).resolve().parent / "tables"
