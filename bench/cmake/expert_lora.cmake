# LoRA on a mixture of experts' stacked weights: forward + backward against the plain experts,
# same run.
add_executable(bench_expert_lora ${CMAKE_CURRENT_SOURCE_DIR}/bench_expert_lora.cpp)
target_link_libraries(bench_expert_lora PRIVATE deepspeed)
