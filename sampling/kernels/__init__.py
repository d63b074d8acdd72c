"""The sampling kernels (numba only): generator, draws, picks, one hop's memory phases, the hop kernel,
ID maps, one hop over blocks read with ``pread``, and the records they take (``structs``).

One unit for numba's compile cache: these modules call each other's kernels."""
