// Static weights on 2 MiB pages.
//
// A dense layer at small M streams its whole weight from DRAM (BERT-base's
// 340 MB do not stay in cache) one 4 KiB page after another: the hardware
// prefetchers stop at every page boundary and every page costs a TLB walk.
// Backed by transparent huge pages, the same tuned kernel ran 18% faster at
// M=1 and 7-8% at M=17 and 62 on cold weights (docs/decisions.md). The
// buffer is collapsed in place (MADV_COLLAPSE, Linux 6.1+: same addresses,
// same contents), every 2 MiB page it touches; where the kernel or its THP
// setting does not allow it, nothing changes.
#ifndef TF_DIETCODE_OPS_HUGE_PAGES_H_
#define TF_DIETCODE_OPS_HUGE_PAGES_H_

#include <atomic>

#include "tensorflow/core/framework/tensor.h"

namespace tf_dietcode {

// One op's weight. Only the first buffer an op sees is collapsed (a few ms,
// once): a weight that changes buffer every call would otherwise pay that
// every call. Thread-safe; later calls cost one atomic load.
class HugePageBacking {
 public:
  void Ensure(const tensorflow::Tensor& weight);

 private:
  std::atomic<bool> tried_{false};
};

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_HUGE_PAGES_H_
