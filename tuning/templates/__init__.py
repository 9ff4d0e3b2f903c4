"""Micro-kernel templates, one module per op kind: compute definition, weight
layout and the schedule that turns micro-kernel parameters into a kernel."""
