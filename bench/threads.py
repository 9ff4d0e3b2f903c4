"""TF's and TVM's thread pools as every benchmark runs them: 2 intra-op threads
(this machine's cores) and one inter-op thread unless a benchmark runs ops side
by side; TVM's pool as many threads, unbound as TF's are."""

import os

import tensorflow as tf


def use_threads(intra_op: int = 2, inter_op: int = 1) -> None:
    """Must run before TF executes its first op."""
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def use_tvm_threads(threads: int = 2) -> None:
    """Must run before TVM's pool starts (at the first parallel kernel called from Python).

    Its threads yield in a loop after a kernel's last call before they sleep: 300000
    sched_yields by default, ~170 ms of a full core on a 2-core machine, which took a core from TF timed
    next. Fewer yields last longer than they look once TF's threads want the core (each yield
    waits for one of theirs to block): with 2000, TF's dense batch 1 at T = 5 timed right after
    a kernel still ran 1.1-2x its time alone. 100 carries them across the back-to-back calls of a
    timing (no thread slept between a 2 us kernel's calls), and they sleep soon after."""
    os.environ["TVM_NUM_THREADS"] = str(threads)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "100")
