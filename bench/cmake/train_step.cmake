add_executable(bench_train_step ${CMAKE_CURRENT_SOURCE_DIR}/bench_train_step.cpp)
target_link_libraries(bench_train_step PRIVATE deepspeed)
# The GEMM libraries called directly, side by side (dlopen; no link to the engine).
add_executable(bench_gemm_libs ${CMAKE_CURRENT_SOURCE_DIR}/bench_gemm_libs.cpp)
target_link_libraries(bench_gemm_libs PRIVATE ${CMAKE_DL_LIBS})
