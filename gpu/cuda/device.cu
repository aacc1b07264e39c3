#include "gpu/cuda/device.cuh"
#include "gpu/cuda/ops.hpp"

#include <mutex>
#include <set>
#include <utility>

namespace tireless::cuda {

using detail::check;

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("CUDA: ") + cudaGetErrorString(e) : std::string("no CUDA device");
    cudaGetLastError();  // clear it
    return false;
  }
  return true;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

device_info info_of(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  device_info d;
  d.name = p.name;
  d.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  d.multiprocessors = p.multiProcessorCount;
  d.major = p.major;
  d.minor = p.minor;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  check(cudaSetDevice(device), "cudaSetDevice");
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  check(cudaSetDevice(current), "cudaSetDevice");
  d.free_bytes = static_cast<int64_t>(free_bytes);
  return d;
}

void synchronize() { check(cudaDeviceSynchronize(), "a CUDA kernel failed"); }

void clear_last_error() { cudaGetLastError(); }

namespace detail {

int max_shared_per_block() {
  int device = 0, bytes = 48 * 1024;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  return bytes;
}

void allow_shared(const void* kernel, int bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  // Raised once per device and kernel, to the device's whole opt-in limit, so that any later
  // launch (also one inside a graph capture) finds it done.
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> raised;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const int limit = max_shared_per_block();
  if (bytes > limit) {
    throw std::invalid_argument(std::string(what) + ": needs " + std::to_string(bytes) +
                                " bytes of shared memory, more than this device's " + std::to_string(limit));
  }
  std::lock_guard<std::mutex> lock(mu);
  if (raised.count({device, kernel})) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit), what);
  raised.insert({device, kernel});
}

}  // namespace detail

device_buffer::device_buffer(size_t bytes) : n_(bytes) {
  if (bytes > 0) check(cudaMalloc(&p_, bytes), "cudaMalloc");
}
device_buffer::~device_buffer() {
  if (p_) cudaFree(p_);
}
device_buffer::device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}
void device_buffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > n_) throw std::out_of_range("device_buffer::upload past its end");
  check(cudaMemcpy(static_cast<char*>(p_) + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void device_buffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > n_) throw std::out_of_range("device_buffer::download past its end");
  check(cudaMemcpy(dst, static_cast<const char*>(p_) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
void device_buffer::zero() {
  if (n_ > 0) check(cudaMemset(p_, 0, n_), "cudaMemset");
}

pinned_buffer::pinned_buffer(size_t bytes) : n_(bytes) {
  if (bytes > 0) check(cudaMallocHost(&p_, bytes), "cudaMallocHost");
}
pinned_buffer::~pinned_buffer() {
  if (p_) cudaFreeHost(p_);
}
pinned_buffer::pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
pinned_buffer& pinned_buffer::operator=(pinned_buffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

stream::stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  s_ = s;
}
stream::~stream() {
  if (s_) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}
void stream::synchronize() const { check(cudaStreamSynchronize(static_cast<cudaStream_t>(s_)), "a CUDA kernel failed"); }

event::event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  e_ = e;
}
event::~event() {
  if (e_) cudaEventDestroy(static_cast<cudaEvent_t>(e_));
}
event::event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
event& event::operator=(event&& o) noexcept {
  if (this != &o) {
    if (e_) cudaEventDestroy(static_cast<cudaEvent_t>(e_));
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void event::record(void* s) { check(cudaEventRecord(static_cast<cudaEvent_t>(e_), detail::stream_of(s)), "cudaEventRecord"); }
void event::synchronize() const { check(cudaEventSynchronize(static_cast<cudaEvent_t>(e_)), "a CUDA kernel failed"); }

void copy_to_device_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, detail::stream_of(s)), "copy to the device");
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to the host");
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, detail::stream_of(s)), "copy to the host");
}
void copy_on_device_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::stream_of(s)), "copy on the device");
}

graph::~graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void graph::begin_capture(void* s) {
  check(cudaStreamBeginCapture(detail::stream_of(s), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

void graph::end_capture(void* s) {
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(detail::stream_of(s), &g), "capturing a CUDA graph");
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(g);
    check(err, "cudaGraphInstantiate");
  }
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  graph_ = g;
  exec_ = e;
}

void graph::launch(void* s) const {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), detail::stream_of(s)), "cudaGraphLaunch");
}

device_matrix view_of(const matrix_layout& l, const void* base) {
  device_matrix m;
  m.type = l.type;
  m.rows = l.rows;
  m.cols = l.cols;
  m.qs_row_bytes = l.qs_row_bytes;
  m.qs = base;
  if (is_quantized(l.type)) {
    m.d = static_cast<const char*>(base) + l.d_offset;
    if (l.type == tensor_type::q4_1) m.m = static_cast<const char*>(base) + l.m_offset;
  }
  return m;
}

}  // namespace tireless::cuda
