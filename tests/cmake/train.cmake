# Training program pieces: Hugging Face style weight import/export (round trip and every error
# path, label checkpoint) and the metrics files ds_train writes (CSV monitor, SVG chart).
ds_add_test(test_hf_io LABELS checkpoint finetune SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_io.cpp)
ds_add_test(test_monitor LABELS train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_monitor.cpp)
# ds_train itself, run as a program on a synthetic corpus: outputs, exact resume, rotation, errors.
ds_add_test(test_ds_train LABELS train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ds_train.cpp)
target_compile_definitions(test_ds_train PRIVATE DS_TRAIN_BIN="$<TARGET_FILE:ds_train>")
add_dependencies(test_ds_train ds_train)
# With MPI, ds_train also runs on 2 ranks through the deepspeed launcher (ZeRO-2 and ZeRO-3).
if(DS_HAVE_MPI)
  target_compile_definitions(test_ds_train PRIVATE DS_LAUNCHER_EXE="$<TARGET_FILE:ds_launcher>")
  add_dependencies(test_ds_train ds_launcher)
  set_tests_properties(test_ds_train PROPERTIES LABELS "train;distributed"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120")
endif()
# The library's trainer called directly (no process): planning, exact resume, rotation.
ds_add_test(test_trainer LABELS train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trainer.cpp)
