"""The C++ rules as Bazel 4 builds them in, under rules_cc's names.

Debian's bazel-bootstrap (Bazel 4.2) loads @rules_cc//cc:defs.bzl from its own
tools but ships no rules_cc of that age; the rules_cc of that time only
forwarded to these native rules, and so does this stand-in, so an offline
build needs no download.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
