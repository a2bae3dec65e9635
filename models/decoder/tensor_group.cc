// The tensor-parallel group's collectives.
#include "models/decoder/tensor_group.h"

namespace zeroth::gpt {

void TensorGroup::reduce(float* partial, float* rows, size_t BT) const {
  if (comm_ == nullptr || dims_.tp == 1) return;
  const size_t n = BT * dims_.C;
  if (!dims_.sp) {
    comm_->all_reduce(stream_, {partial, n, DType::f32}, ReduceOp::sum);
    return;
  }
  comm_->reduce_scatter(stream_, {partial, n, DType::f32}, {rows, n / dims_.tp, DType::f32}, ReduceOp::sum);
}

void TensorGroup::gather(float* whole, size_t BT) const {
  if (comm_ == nullptr || !dims_.sp) return;
  const size_t n = BT * dims_.C;
  const TensorView all{whole, n, DType::f32};
  comm_->all_gather(stream_, all.slice(dims_.row_offset(BT), n / dims_.tp), all);
}

const float* TensorGroup::gathered_rows(const float* rows, float* whole, size_t BT) const {
  if (!dims_.sp) return rows;
  stream_.device().copy(stream_, whole + dims_.row_offset(BT), rows, dims_.rows(BT) * dims_.C * sizeof(float));
  gather(whole, BT);
  return whole;
}

void TensorGroup::keep_rows(const float* whole, float* rows, size_t BT) const {
  if (!dims_.sp) return;
  stream_.device().copy(stream_, rows, whole + dims_.row_offset(BT), dims_.rows(BT) * dims_.C * sizeof(float));
}

void TensorGroup::all_reduce(float* x, size_t n, ReduceOp op) const {
  if (comm_ != nullptr && dims_.tp > 1) comm_->all_reduce(stream_, {x, n, DType::f32}, op);
}

}  // namespace zeroth::gpt
