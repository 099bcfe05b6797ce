# Runtime: DeepSpeed config parsing (src/runtime/config*.cpp), lr schedules and the fp16 loss
# scaler. The schedule and loss-scaler tests compare against tests/fixtures/config/*.json, written
# by tests/fixtures/generators/gen_schedule_fixture.py from DeepSpeed's own Python code.
ds_add_test(test_config LABELS config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.cpp)
ds_add_test(test_schedule LABELS schedule SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_schedule.cpp)
ds_add_test(test_loss_scaler LABELS precision SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_loss_scaler.cpp)
