#include "broadcast.h"

#include <algorithm>

namespace tf_dietcode {

Dims DimsOf(const tensorflow::TensorShape& shape) {
  Dims dims;
  for (int i = 0; i < shape.dims(); ++i) dims.push_back(shape.dim_size(i));
  return dims;
}

Dims DenseStrides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    strides[i] = static_cast<int64_t>(static_cast<uint64_t>(strides[i + 1]) *
                                      static_cast<uint64_t>(dims[i + 1]));
  }
  return strides;
}

bool BroadcastShapes(const Dims& x, const Dims& y, Dims* out) {
  const size_t rank = std::max(x.size(), y.size());
  out->assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t dx = i < rank - x.size() ? 1 : x[i - (rank - x.size())];
    const int64_t dy = i < rank - y.size() ? 1 : y[i - (rank - y.size())];
    if (dx != dy && dx != 1 && dy != 1) return false;
    (*out)[i] = dx == 1 ? dy : dx;
  }
  return true;
}

bool BroadcastStrides(const Dims& dims, const Dims& stored_strides,
                      const Dims& target, Dims* strides) {
  if (dims.size() > target.size()) return false;
  const size_t lead = target.size() - dims.size();
  strides->assign(target.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == target[lead + i]) {
      (*strides)[lead + i] = dims[i] == 1 ? 0 : stored_strides[i];
    } else if (dims[i] != 1) {
      return false;
    }
  }
  return true;
}

}  // namespace tf_dietcode
