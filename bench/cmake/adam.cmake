# Adam step vs memory bandwidth (STREAM triad) and naive implementations, same run.
add_executable(bench_adam ${CMAKE_CURRENT_SOURCE_DIR}/bench_adam.cpp)
target_link_libraries(bench_adam PRIVATE deepspeed)
