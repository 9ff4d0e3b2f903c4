"""tf_custom_op_library as TensorFlow's own macro defines it, for the pip wheel:
a shared library of the op sources, compiled against TensorFlow's headers and
linked with libtensorflow_framework."""

def tf_custom_op_library(name, srcs = [], deps = [], copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = copts,
        linkopts = linkopts,
        linkshared = 1,
        deps = deps + ["@org_tensorflow//tensorflow/core:framework"],
        **kwargs
    )
