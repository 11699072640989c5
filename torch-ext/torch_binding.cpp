// Registration of the persistent_matmul ops through torch's stable ABI, and
// the one place where torch tensors become the plain MatmulProblem that the
// CUDA rungs take.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/headeronly/util/Exception.h>

#include "matmul_problem.h"
#include "registration.h"
#include "torch_binding.h"

namespace {

using persistent_matmul::ElementType;
using persistent_matmul::MatmulProblem;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

ElementType element_type_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return ElementType::kFloat32;
    case ScalarType::Half: return ElementType::kFloat16;
    case ScalarType::BFloat16: return ElementType::kBFloat16;
    default:
      STD_TORCH_CHECK(false, "persistent_matmul: ", name,
                      " must be float32, float16 or bfloat16");
  }
  return ElementType::kFloat32;  // unreachable
}

void check_cuda_on(const Tensor& t, const char* name, int32_t device) {
  STD_TORCH_CHECK(t.is_cuda(), "persistent_matmul: ", name, " must be a CUDA tensor");
  STD_TORCH_CHECK(t.get_device_index() == device, "persistent_matmul: ", name,
                  " is on cuda:", t.get_device_index(), " but a is on cuda:", device);
}

MatmulProblem describe(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
                       const Tensor& out) {
  STD_TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2,
                  "persistent_matmul: a, b and out must be 2-D");
  STD_TORCH_CHECK(a.is_cuda(), "persistent_matmul: a must be a CUDA tensor");
  const int32_t device = a.get_device_index();
  check_cuda_on(b, "b", device);
  check_cuda_on(out, "out", device);
  MatmulProblem p;
  p.m = a.size(0);
  p.k = a.size(1);
  p.n = b.size(1);
  STD_TORCH_CHECK(b.size(0) == p.k, "persistent_matmul: a is ", p.m, "x", p.k, " but b is ",
                  b.size(0), "x", p.n);
  STD_TORCH_CHECK(out.size(0) == p.m && out.size(1) == p.n, "persistent_matmul: out must be ",
                  p.m, "x", p.n);
  p.dtype = element_type_of(a, "a");
  STD_TORCH_CHECK(element_type_of(b, "b") == p.dtype && element_type_of(out, "out") == p.dtype,
                  "persistent_matmul: a, b and out must have the same dtype");
  p.a = a.data_ptr();
  p.a_stride_m = a.stride(0);
  p.a_stride_k = a.stride(1);
  p.b = b.data_ptr();
  p.b_stride_k = b.stride(0);
  p.b_stride_n = b.stride(1);
  p.out = out.data_ptr();
  p.out_stride_m = out.stride(0);
  p.out_stride_n = out.stride(1);
  if (bias.has_value()) {
    const Tensor& bias_t = *bias;
    check_cuda_on(bias_t, "bias", device);
    STD_TORCH_CHECK(bias_t.dim() == 1 && bias_t.size(0) == p.n && (p.n <= 1 || bias_t.stride(0) == 1),
                    "persistent_matmul: bias must be a contiguous 1-D tensor of ", p.n, " elements");
    STD_TORCH_CHECK(element_type_of(bias_t, "bias") == p.dtype,
                    "persistent_matmul: bias must have the dtype of a");
    p.bias = bias_t.data_ptr();
  }
  return p;
}

using Launcher = cudaError_t (*)(const MatmulProblem&, cudaStream_t);

void run(Launcher launch, const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
         const Tensor& out) {
  const MatmulProblem problem = describe(a, b, bias, out);
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(a.get_device_index(), &stream) ==
                      AOTI_TORCH_SUCCESS,
                  "persistent_matmul: could not get the current CUDA stream");
  const cudaError_t err = launch(problem, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, "persistent_matmul: kernel launch failed: ",
                  cudaGetErrorString(err));
}

}  // namespace

void naive_matmul(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out) {
  run(persistent_matmul::launch_naive, a, b, bias, out);
}

STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("naive(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
  ops.impl("naive", TORCH_BOX(&naive_matmul));
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
