"""Reduced-precision modes: weights converted at optimize time, the ops that read them."""
