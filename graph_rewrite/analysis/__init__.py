"""What the rewriter knows about a signature's graph before changing it: the graph flattened
(signature_graph), its nodes' producers, readers, shapes and fixed values (graph_index),
expression trees (expression_patterns), dims as expressions of the inputs' (symbolic_shapes),
the shape ranges the model will see (shape_ranges) and what loops prove of their bodies'
shapes (loop_ranges)."""
