# ds_estimate: DeepSpeed's ZeRO memory estimator tables (see docs/zero.md, "Memory estimator").
add_executable(ds_estimate ${CMAKE_CURRENT_SOURCE_DIR}/ds_estimate.cpp)
target_link_libraries(ds_estimate PRIVATE deepspeed)
