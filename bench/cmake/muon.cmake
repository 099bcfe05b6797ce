# Muon's optimizer step and state against AdamW's over GPT-2 124M's tensors, same run.
add_executable(bench_muon ${CMAKE_CURRENT_SOURCE_DIR}/bench_muon.cpp)
target_link_libraries(bench_muon PRIVATE deepspeed)
