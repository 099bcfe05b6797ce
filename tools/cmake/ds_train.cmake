# ds_train: the training program (see docs/training.md). Its built-in default DeepSpeed config is
# configs/ds_demo.json, compiled in so that the binary works from any directory; editing the file
# re-runs the configure step.
set(DS_TRAIN_DEFAULT_CONFIG ${PROJECT_SOURCE_DIR}/configs/ds_demo.json)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${DS_TRAIN_DEFAULT_CONFIG})
file(READ ${DS_TRAIN_DEFAULT_CONFIG} DS_TRAIN_DEFAULT_CONFIG_TEXT)
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/generated/ds_train_default_config.h
  CONTENT "#pragma once\n// Generated from configs/ds_demo.json by tools/cmake/ds_train.cmake.\ninline constexpr const char* kDefaultDeepSpeedConfig = R\"DSCONFIG(@DS_TRAIN_DEFAULT_CONFIG_TEXT@)DSCONFIG\";\n"
  @ONLY)

# The trainer itself is the library's (src/train); the program is its option table and console.
add_executable(ds_train
  ${CMAKE_CURRENT_SOURCE_DIR}/ds_train.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/classify_run.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/console.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/options.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/progress.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/seq2seq_run.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train/task_run.cpp)
target_include_directories(ds_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train
  ${CMAKE_CURRENT_BINARY_DIR}/generated)
target_link_libraries(ds_train PRIVATE deepspeed)
