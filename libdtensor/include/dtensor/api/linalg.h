#pragma once
// Front-end functions of the linalg ops: matmul, bmm, linear and einsum, on
// plain Tensors and on DTensors alike. All are one einsum rule underneath
// (ops/src/einsum.cpp): a dim sharded on the operands that hold it stays
// sharded in the output, a contracted dim sharded on both gives Partial(sum),
// and one Partial(sum) operand with the rest replicated stays Partial(sum).
// Shape errors name the op and the shapes ("[matmul] shapes 3x4 and 5x6: the
// contracted dims differ (4 vs 5)").
#include <initializer_list>
#include <span>
#include <string>

#include "dtensor/api/functional.h"

namespace dtensor {

/// torch.matmul: 1-D operands gain and then lose a dim; dims before the last
/// two are batch dims and broadcast.
inline Tensor matmul(const Tensor& a, const Tensor& b) { return call_op_on(registered_op<"matmul">(), {}, a, b); }
inline DTensor matmul(const DTensor& a, const DTensor& b) { return call_op_on(registered_op<"matmul">(), {}, a, b); }

/// Batched product [b,n,k] x [b,k,m] -> [b,n,m] (no broadcasting).
inline Tensor bmm(const Tensor& a, const Tensor& b) { return call_op_on(registered_op<"bmm">(), {}, a, b); }
inline DTensor bmm(const DTensor& a, const DTensor& b) { return call_op_on(registered_op<"bmm">(), {}, a, b); }

/// y = x W^T (+ bias): x [..., in], weight [out, in], bias [out]. Column
/// parallel: weight S(0), bias S(0), x R gives y S(-1); row parallel: weight
/// S(1), x S(-1) gives y P(sum) with no communication.
inline Tensor linear(const Tensor& x, const Tensor& weight) {
  return call_op_on(registered_op<"linear">(), {}, x, weight);
}
inline DTensor linear(const DTensor& x, const DTensor& weight) {
  return call_op_on(registered_op<"linear">(), {}, x, weight);
}
inline Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return call_op_on(registered_op<"linear_bias">(), {}, x, weight, bias);
}
inline DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias) {
  return call_op_on(registered_op<"linear_bias">(), {}, x, weight, bias);
}

/// Einstein summation: "bij,bjk->bik", "ij->ji", "ii->i" (diagonal), "ij->"
/// (sum), "...ij,...jk->...ik" (broadcast batch dims). Without "->" the output
/// is the "..." dims then the labels that appear once, alphabetically.
inline Tensor einsum(const std::string& equation, std::span<const Tensor> inputs) {
  return call_op(registered_op<"einsum">(), inputs, EinsumAttrs{.equation = equation});
}
inline DTensor einsum(const std::string& equation, std::span<const DTensor> inputs) {
  return call_op(registered_op<"einsum">(), inputs, EinsumAttrs{.equation = equation});
}
inline Tensor einsum(const std::string& equation, std::initializer_list<Tensor> inputs) {
  return einsum(equation, std::span<const Tensor>(inputs.begin(), inputs.size()));
}
inline DTensor einsum(const std::string& equation, std::initializer_list<DTensor> inputs) {
  return einsum(equation, std::span<const DTensor>(inputs.begin(), inputs.size()));
}

}  // namespace dtensor
