// Numpy broadcasting as strides: which element of each operand an output
// element reads, so ops read broadcast operands in place.
#ifndef TF_DIETCODE_OPS_BROADCAST_H_
#define TF_DIETCODE_OPS_BROADCAST_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_dietcode {

using Dims = std::vector<int64_t>;

Dims DimsOf(const tensorflow::TensorShape& shape);

// Row-major element strides of a dense tensor with `dims`. An empty tensor's
// dims may multiply past int64 (e.g. [0, 2^40, 2^40]); its strides are never
// used, so they wrap (unsigned) rather than overflow.
Dims DenseStrides(const Dims& dims);

// Numpy broadcasting of two shapes; false when they are incompatible.
bool BroadcastShapes(const Dims& x, const Dims& y, Dims* out);

// Strides with which a tensor of `dims`, stored with `stored_strides`, is read
// when broadcast to `target` (right-aligned); 0 marks a broadcast dimension.
// False when `dims` does not broadcast to `target` without growing it.
bool BroadcastStrides(const Dims& dims, const Dims& stored_strides,
                      const Dims& target, Dims* strides);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_BROADCAST_H_
