ds_add_test(test_engine LABELS precision resume checkpoint SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.cpp)
# The checkpoint-folder reader that resume and ds_to_fp32 share (runtime/checkpoint_reader.h):
# folder/tag resolution, checksums naming the damaged file, the model-states metadata.
ds_add_test(test_checkpoint_reader LABELS checkpoint resume
            SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_checkpoint_reader.cpp)
# The flops profiler (runtime/flops_profiler.h) and the ops' FLOP counts: formulas, 6·N·T, and
# torch.utils.flop_counter on the hf_families fixtures (tests/fixtures/flops, written by
# tests/fixtures/generators/gen_flops_fixture.py).
ds_add_test(test_flops_profiler LABELS profiler SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_flops_profiler.cpp)
