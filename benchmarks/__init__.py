"""seqae's benchmarks: what a user measures on their own machine, each module a ``seqae bench`` suite."""
