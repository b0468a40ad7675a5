# Parallel ranks (--cp/--ep/--dp) against the single rank, over shared memory, MPI on one host
# and MPI across two (namespaced) hosts, and a follower's death.
add_test(NAME e2e.ranks_shm COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ranks_test.sh $<TARGET_FILE:deepinfer> shm)
set_tests_properties(e2e.ranks_shm PROPERTIES LABELS e2e TIMEOUT 900)
if(DEEPINFER_RANKS_HAVE_MPI)
  add_test(NAME e2e.ranks_mpi COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ranks_test.sh $<TARGET_FILE:deepinfer> mpi)
  set_tests_properties(e2e.ranks_mpi PROPERTIES LABELS "e2e;mpi" TIMEOUT 900)
  # Two hosts as two network namespaces, MPI over TCP between them; skipped (77) where the machine
  # forbids namespaces.
  add_test(NAME e2e.ranks_two_hosts COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/two_hosts_test.sh $<TARGET_FILE:deepinfer>)
  set_tests_properties(e2e.ranks_two_hosts PROPERTIES LABELS "e2e;mpi" TIMEOUT 900 SKIP_RETURN_CODE 77)
endif()
add_test(NAME e2e.rank_death COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/rank_death_test.sh $<TARGET_FILE:deepinfer>)
set_tests_properties(e2e.rank_death PROPERTIES LABELS e2e TIMEOUT 120)
