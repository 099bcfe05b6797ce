# ds_serve under load (bench/run_serve.sh starts the server and measures the reference): a client
# that sends streaming completions from N threads and reports latency percentiles and tokens/s.
add_executable(bench_serve ${CMAKE_CURRENT_SOURCE_DIR}/bench_serve.cpp)
target_link_libraries(bench_serve PRIVATE ds_serve_http)
