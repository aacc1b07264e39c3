#pragma once
// A model's weights in device memory, in their GGUF types (weight_layout.hpp), for the CUDA
// backend. Tensors that one product can compute together share a matrix: Q, K and V; an FFN's
// gate and up (per expert for MoE, expert after expert); where their types differ they stay
// apart and each writes its own columns of the product's output.

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/weight_layout.hpp"

namespace tireless {
class model;
struct gguf_tensor;
}  // namespace tireless

namespace tireless::cuda {

struct device_weight {
  device_buffer memory;
  device_matrix m;
  bool quantized() const { return is_quantized(m.type); }
};

// One matrix of a product whose output columns it fills from `column`; grouped (MoE): each
// expert's rows_per_expert rows, expert after expert.
struct product_part {
  device_weight w;
  int64_t column = 0;
  int64_t rows_per_expert = 0;
};

struct layer_weights {
  device_buffer attn_norm, ffn_norm;  // f32 [n_embd]
  std::vector<product_part> qkv;      // output [q_dim | kv_dim | kv_dim]
  product_part wo;
  std::vector<product_part> gate_up;  // dense: output [n_ff | n_ff]
  product_part down;
  product_part router;                // MoE: [n_expert][n_embd]
};

// One rank's experts of one layer: experts first .. first + count - 1, renumbered from 0.
struct expert_layer {
  std::vector<product_part> gate_up;  // output [n_ff | n_ff] per pair
  product_part down;
};

struct model_weights {
  product_part token_embd, output;  // output: token_embd again when tied (not a copy)
  device_buffer output_norm;
  std::vector<layer_weights> layers;
  bool tied = false;
  const device_matrix& output_matrix() const { return tied ? token_embd.w.m : output.w.m; }
};

// Bytes the weights of the current device take: everything but the experts, and the experts
// [first_expert, first_expert + n_experts) of every layer.
int64_t weight_bytes(const model& m, bool with_dense, int32_t first_expert, int32_t n_experts);

// Uploads to the current device. Throws std::runtime_error naming a tensor the backend cannot
// run (a width that is not a multiple of 8, or of 32 for a quantized type).
model_weights upload_dense_weights(const model& m);
std::vector<expert_layer> upload_experts(const model& m, int32_t first_expert, int32_t n_experts);

}  // namespace tireless::cuda
