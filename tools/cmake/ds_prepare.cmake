# ds_prepare: text files -> GPT-2 token shards (see docs/data.md).
add_executable(ds_prepare ${CMAKE_CURRENT_SOURCE_DIR}/ds_prepare.cpp)
target_link_libraries(ds_prepare PRIVATE deepspeed)
