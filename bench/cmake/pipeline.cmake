# Pipeline bubble (src/runtime/pipeline_engine.cpp): each stage's measured idle fraction against
# (p - 1) / (m + p - 1). Run under mpirun; see the file's header.
add_executable(bench_pipeline ${CMAKE_CURRENT_SOURCE_DIR}/bench_pipeline.cpp)
target_link_libraries(bench_pipeline PRIVATE deepspeed)
