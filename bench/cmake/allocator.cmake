# The device caching allocator's fragmentation on a training run's own allocation trace (sim).
add_executable(bench_allocator ${CMAKE_CURRENT_SOURCE_DIR}/bench_allocator.cpp)
target_link_libraries(bench_allocator PRIVATE deepspeed)
