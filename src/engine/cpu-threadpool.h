// A ggml CPU thread pool that lives as long as its owner, so llama_decode reuses worker threads instead of starting
// and joining fresh ones on every call (what llama-bench does too).
#pragma once

struct ggml_threadpool;

namespace keepwarm {

class cpu_threadpool {
public:
    // Created through the CPU backend's registry, because the CPU backend may be a variant library loaded at run
    // time. get() is null when no CPU backend is loaded or the pool cannot be made; llama.cpp then makes its own.
    explicit cpu_threadpool(int threads);
    ~cpu_threadpool();
    cpu_threadpool(const cpu_threadpool&) = delete;
    cpu_threadpool& operator=(const cpu_threadpool&) = delete;

    ggml_threadpool* get() const { return pool_; }

private:
    ggml_threadpool* pool_ = nullptr;
    void (*release_)(ggml_threadpool*) = nullptr;
};

}  // namespace keepwarm
