# `deepinfer bench` at small sizes: output form and argument errors (figures are not checked).
if(DEEPINFER_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/CMakeLists.txt)
  add_test(NAME e2e.bench COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/bench_test.sh $<TARGET_FILE:deepinfer>)
  set_tests_properties(e2e.bench PROPERTIES LABELS e2e TIMEOUT 300)
endif()
