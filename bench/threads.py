"""TF's thread pools as every benchmark runs them: 2 intra-op threads (this
machine's cores) and one inter-op thread unless a benchmark runs ops side by side."""

import tensorflow as tf


def use_threads(intra_op: int = 2, inter_op: int = 1) -> None:
    """Must run before TF executes its first op."""
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
