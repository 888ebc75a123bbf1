// See cpu-threadpool.h.
#include "engine/cpu-threadpool.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace keepwarm {

cpu_threadpool::cpu_threadpool(int threads) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) return;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto make = reinterpret_cast<ggml_threadpool* (*)(ggml_threadpool_params*)>(
        ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new"));
    release_ =
        reinterpret_cast<void (*)(ggml_threadpool*)>(ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free"));
    if (!make || !release_) return;
    ggml_threadpool_params params = ggml_threadpool_params_default(threads);
    pool_ = make(&params);
}

cpu_threadpool::~cpu_threadpool() {
    if (pool_) release_(pool_);
}

}  // namespace keepwarm
