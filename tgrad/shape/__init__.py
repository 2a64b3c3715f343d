"""Shapes without copies: `View` (one strided, optionally masked window onto a flat buffer) and `ShapeTracker`
(a stack of Views). Movement ops (reshape, permute, expand, pad, shrink, flip, stride) map a ShapeTracker to a new
one; `to_indexed(idxs)` turns loop indices (UOps) into a (memory index, valid) pair of index-math UOps.
"""
