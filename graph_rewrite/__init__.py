"""Graph rewriting: SavedModel patterns -> Dietcode fused ops (the optimize() pass)."""
