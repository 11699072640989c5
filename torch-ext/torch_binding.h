// Ops of persistent_matmul, one per kernel rung. Each computes
// out = a @ b (+ bias) in place into a caller-allocated `out`; the Python
// package validates arguments and allocates, these re-check what a direct
// caller of the op could get wrong, so a bad call raises instead of crashing.
#pragma once

#include <optional>

#include <torch/csrc/stable/tensor.h>

void naive_matmul(const torch::stable::Tensor& a, const torch::stable::Tensor& b,
                  const std::optional<torch::stable::Tensor>& bias, torch::stable::Tensor& out);
