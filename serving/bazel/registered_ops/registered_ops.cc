// Prints the ops and kernels the binary's static registrations added, one op a
// line: "<op name> <kernels registered for it>". Nothing here names the ops'
// code, so they are there only if the library was linked whole (alwayslink).

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

int main() {
  std::vector<tensorflow::OpDef> ops;
  tensorflow::OpRegistry::Global()->GetRegisteredOps(&ops);
  for (const auto& op : ops) {
    if (!absl::StartsWith(op.name(), "Dietcode")) continue;
    const std::string kernels = absl::StrReplaceAll(
        std::string(tensorflow::KernelsRegisteredForOp(op.name())), {{"\n", " "}});
    std::printf("%s %s\n", op.name().c_str(), kernels.c_str());
  }
  return 0;
}
