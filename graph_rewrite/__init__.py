"""Graph rewriting: SavedModel patterns -> Dietcode fused ops (the optimize() pass).

analysis/ reads a signature's graph (inlined graph, index, shapes, ranges); fusions/
holds the fusion kinds, each behind one contract and listed in one registry;
splice writes a kind's replacement into the graph.
"""
