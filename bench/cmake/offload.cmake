# ZeRO-3 + NVMe offload (ZeRO-Infinity): a model larger than RAM trains; step time, bytes moved,
# overlap against the disk bandwidth fio measures in the same run, peak RSS.
# Run: bench/run_offload.sh (results in bench/RESULTS.md).
add_executable(bench_offload ${CMAKE_CURRENT_SOURCE_DIR}/bench_offload.cpp)
target_link_libraries(bench_offload PRIVATE deepspeed)
