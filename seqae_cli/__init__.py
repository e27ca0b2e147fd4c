"""The ``seqae`` command line: the top of the tree, the only package that imports every other."""
