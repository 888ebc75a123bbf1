// Stand-ins for a GPU backend library (libggml-cuda.so) on a machine that cannot use it, for
// test-llama-runtime: built as a backend whose score says "not on this machine", as one that needs a library the
// machine lacks (libggml-cuda.so without the CUDA runtime), and as that library itself.
#ifdef STUB_GPU_RUNTIME
int stub_gpu_runtime_version(void) { return 13; }
#else
#ifdef STUB_NEEDS_RUNTIME
int stub_gpu_runtime_version(void);
int ggml_backend_score(void) { return stub_gpu_runtime_version(); }
#else
int ggml_backend_score(void) { return 0; }
#endif
void* ggml_backend_init(void) { return 0; }
#endif
