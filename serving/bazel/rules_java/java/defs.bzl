"""The Java rules as Bazel 4 builds them in, under rules_java's names: Bazel's
own tools load them (its JDK toolchains) even in a C++-only build; see
../rules_cc/cc/defs.bzl."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
