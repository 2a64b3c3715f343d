"""Code generation: Kernel (axes and OptOps), linearizer (Kernel → linear UOps), heuristics, search, renderers."""
