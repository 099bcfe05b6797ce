# Communication layer (src/comm): included by the top-level CMakeLists.txt after
# add_library(deepspeed ...). The MPI backend when OpenMPI is found and DS_WITH_MPI is on (default),
# otherwise src/comm/no_mpi.cpp, where the world is a size-1 group (stubs, not ifdefs).
option(DS_WITH_MPI "Build the MPI communication backend (needs libopenmpi-dev)" ON)

target_sources(deepspeed PRIVATE
  ${PROJECT_SOURCE_DIR}/src/comm/compressed.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/group.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/logger.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/reduce.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/topology.cpp)

set(DS_HAVE_MPI OFF)
if(DS_WITH_MPI)
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(DS_HAVE_MPI ON)
  else()
    message(WARNING "DS_WITH_MPI is ON but MPI was not found: building without MPI "
                    "(install libopenmpi-dev openmpi-bin, or pass -DDS_WITH_MPI=OFF)")
  endif()
endif()

if(DS_HAVE_MPI)
  target_sources(deepspeed PRIVATE
    ${PROJECT_SOURCE_DIR}/src/comm/mpi_runtime.cpp
    ${PROJECT_SOURCE_DIR}/src/comm/mpi_group.cpp
    ${PROJECT_SOURCE_DIR}/src/comm/mpi_deadlines.cpp
    ${PROJECT_SOURCE_DIR}/src/comm/shm.cpp)
  target_link_libraries(deepspeed PUBLIC MPI::MPI_C)
  target_compile_definitions(deepspeed PUBLIC DS_WITH_MPI=1)
  message(STATUS "deepspeed.cpp: MPI backend (${MPI_C_LIBRARIES}), mpiexec ${MPIEXEC_EXECUTABLE}")
else()
  target_sources(deepspeed PRIVATE ${PROJECT_SOURCE_DIR}/src/comm/no_mpi.cpp)
  message(STATUS "deepspeed.cpp: no MPI backend (single-process groups only)")
endif()
