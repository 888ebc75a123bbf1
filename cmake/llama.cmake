# Provides the target keepwarm::llama (libllama + ggml + llama.cpp's common, with headers) and the variables
# KEEPWARM_LLAMA_SOURCE_DIR (the pinned source tree: headers, models/, tools/) and KEEPWARM_LLAMA_RUNTIME_LIBS
# (shared libraries to place next to the binary, including the per-CPU ggml backends loaded at run time).
#
# Two ways to get llama.cpp:
#   default:                 the prebuilt release of the pinned commit from the npm registry (scripts/fetch-llama.sh),
#                            cached outside the build tree and keyed by version;
#   -DKEEPWARM_LLAMA_SOURCE=/path/to/llama.cpp   build the user's own llama.cpp checkout with this project.

set(KEEPWARM_LLAMA_SOURCE "" CACHE PATH "Build against this llama.cpp source tree instead of the pinned prebuilt release")

if(KEEPWARM_LLAMA_SOURCE)
    set(LLAMA_BUILD_COMMON ON CACHE BOOL "" FORCE)
    set(LLAMA_BUILD_TESTS OFF CACHE BOOL "" FORCE)
    set(LLAMA_BUILD_TOOLS OFF CACHE BOOL "" FORCE)
    set(LLAMA_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
    set(LLAMA_BUILD_SERVER OFF CACHE BOOL "" FORCE)
    set(LLAMA_OPENSSL OFF CACHE BOOL "" FORCE)
    set(BUILD_SHARED_LIBS ON CACHE BOOL "" FORCE)
    add_subdirectory(${KEEPWARM_LLAMA_SOURCE} ${CMAKE_BINARY_DIR}/llama.cpp EXCLUDE_FROM_ALL)
    add_library(keepwarm_llama INTERFACE)
    target_link_libraries(keepwarm_llama INTERFACE llama llama-common ggml)
    target_include_directories(keepwarm_llama SYSTEM INTERFACE ${KEEPWARM_LLAMA_SOURCE}/vendor)
    add_library(keepwarm::llama ALIAS keepwarm_llama)
    set(KEEPWARM_LLAMA_SOURCE_DIR ${KEEPWARM_LLAMA_SOURCE})
    set(KEEPWARM_LLAMA_RUNTIME_LIBS "")
    return()
endif()

execute_process(
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/../scripts/fetch-llama.sh
    OUTPUT_VARIABLE llama_root OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE fetch_result)
if(NOT fetch_result EQUAL 0)
    message(FATAL_ERROR "scripts/fetch-llama.sh failed; see its output above")
endif()
message(STATUS "llama.cpp (pinned, prebuilt): ${llama_root}")

set(KEEPWARM_LLAMA_SOURCE_DIR ${llama_root}/source)
set(llama_lib ${llama_root}/lib)
set(src ${KEEPWARM_LLAMA_SOURCE_DIR})

add_library(keepwarm_llama INTERFACE)
target_include_directories(keepwarm_llama SYSTEM INTERFACE
    ${src}/include ${src}/ggml/include ${src}/common ${src}/vendor)
target_link_libraries(keepwarm_llama INTERFACE
    ${llama_lib}/libllama-common.so ${llama_lib}/libllama.v0.4.0.so
    ${llama_lib}/libggml.v0.4.0.so ${llama_lib}/libggml-base.so Threads::Threads)
add_library(keepwarm::llama ALIAS keepwarm_llama)

file(GLOB KEEPWARM_LLAMA_RUNTIME_LIBS ${llama_lib}/*.so)

# The CUDA backend (scripts/fetch-llama-cuda.sh): when this machine has an NVIDIA driver, or KEEPWARM_GPU=cuda, one
# more library next to the binary, which the runtime loads only where a CUDA device is present.
set(KEEPWARM_GPU "$ENV{KEEPWARM_GPU}" CACHE STRING "GPU backend: auto (CUDA when an NVIDIA driver is present), cuda, cpu")
execute_process(
    COMMAND ${CMAKE_COMMAND} -E env KEEPWARM_GPU=${KEEPWARM_GPU} ${CMAKE_CURRENT_LIST_DIR}/../scripts/fetch-llama-cuda.sh
    OUTPUT_VARIABLE cuda_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE fetch_result)
if(NOT fetch_result EQUAL 0)
    message(FATAL_ERROR "scripts/fetch-llama-cuda.sh failed; see its output above (KEEPWARM_GPU=cpu builds without)")
endif()
set(KEEPWARM_LLAMA_CUDA_LIB "")
if(cuda_dir)
    set(KEEPWARM_LLAMA_CUDA_LIB ${cuda_dir}/libggml-cuda.so)
    list(APPEND KEEPWARM_LLAMA_RUNTIME_LIBS ${KEEPWARM_LLAMA_CUDA_LIB})
    message(STATUS "CUDA backend: ${KEEPWARM_LLAMA_CUDA_LIB}")
endif()
