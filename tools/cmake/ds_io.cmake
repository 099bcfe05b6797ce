# ds_io: disk bandwidth of the aio layer with DeepSpeed's `aio` settings, and a sweep that suggests
# them (DeepSpeed's ds_io / ds_nvme_tune). bench/run_ds_io.sh compares it with fio.
add_executable(ds_io ${CMAKE_CURRENT_SOURCE_DIR}/ds_io.cpp)
target_link_libraries(ds_io PRIVATE deepspeed)
