"""Execution paths: the ways to run a lazy graph (a lowering per composite op, opts per kernel, a device per part),
measured and stored in a benchmark database, and the selection of the fastest within a tolerance.

db.py stores measurements and selects; fingerprint.py says what hardware and which code a measurement belongs to.
Nothing is imported here, so importing a submodule stays cheap.
"""
