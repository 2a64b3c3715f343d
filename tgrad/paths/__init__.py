from tgrad.paths.equivalence import equivalent, Verdict  # noqa: F401
