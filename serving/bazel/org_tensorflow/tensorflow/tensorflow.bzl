"""tf_custom_op_library as TensorFlow's own macro defines it, for the pip wheel:
a shared library of the op sources, compiled against TensorFlow's headers
(TF adds framework_headers_lib: tf_custom_op_library_additional_deps) and
linked with libtensorflow_framework (as tf_cc_shared_object does). TF's
check_deps, which fails a build where :framework or :lib is among the
transitive deps, is not reproduced here."""

def tf_custom_op_library(name, srcs = [], deps = [], copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = copts,
        linkopts = linkopts,
        linkshared = 1,
        deps = deps + [
            "@org_tensorflow//tensorflow/core:framework_headers_lib",
            "@org_tensorflow//tensorflow/core:framework",
        ],
        **kwargs
    )
