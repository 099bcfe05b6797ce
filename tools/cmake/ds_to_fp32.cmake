# ds_to_fp32: DeepSpeed's zero_to_fp32 for our checkpoints (docs/checkpoints.md): the fp32 master
# weights of any world size and stage as one safetensors file or an HF folder. It shares ds_train's
# tokenizer export (the library's src/train/outputs.cpp).
add_executable(ds_to_fp32 ${CMAKE_CURRENT_SOURCE_DIR}/ds_to_fp32.cpp)
target_link_libraries(ds_to_fp32 PRIVATE deepspeed)
